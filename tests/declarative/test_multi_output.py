"""Several output features trained together (Ludwig's multi-task ECD): one model whose
outputs share the encoders and combiner, trained on the sum of their weighted losses;
each output's metrics, predictions and early-stopping field."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.loading import load_config
from tests.declarative_data import MULTI, multi, write

pytestmark = pytest.mark.timeout(300)


def _train(tmp_path, config=MULTI, name="run"):
    cfg, data = write(tmp_path, fmt="parquet", df=multi(), config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / name), progress=False)
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return out, rows, data


def test_several_outputs_learn_together_each_with_its_metrics_and_predictions(tmp_path):
    """Each of three outputs learns its target; the test split's metrics are each output's
    as ``<output>/<metric>`` and ``loss``, Ludwig's combined loss (each output's loss times
    its weight: z's Ludwig loss.weight 0.5); the epochs report each output's training and
    validation metrics; predict gives each output's columns, evaluate its metrics."""
    from raylight.declarative.train import load_model

    out, rows, _ = _train(tmp_path)
    test = out["evaluation"]["test"]
    assert test["y/accuracy"] > 0.9 and test["z/r2"] > 0.9 and test["k/accuracy"] > 0.85, test
    assert test["loss"] == pytest.approx(test["y/loss"] + 0.5 * test["z/loss"] + test["k/loss"], rel=1e-9)
    assert {"validation_y/roc_auc", "validation_z/mae", "validation_k/accuracy", "train_z/loss"} <= set(rows[-1])
    last = rows[-1]
    assert last["train_loss"] == pytest.approx(last["train_y/loss"] + 0.5 * last["train_z/loss"] + last["train_k/loss"], rel=1e-6)

    model = load_model(out["model_path"])
    assert [o.name for o in model.outputs] == ["y", "z", "k"] and model.config.output_features[1].loss_weight == 0.5
    df = multi(200, seed=7)
    predicted = model.predict(df)
    assert list(predicted.columns) == [
        "y_predictions", "y_probabilities", "z_predictions",
        "k_predictions", "k_probability_hi", "k_probability_lo", "k_probability_mid",
    ]
    assert (predicted["y_predictions"] == df["y"]).mean() > 0.9
    assert np.corrcoef(predicted["z_predictions"].astype(float), df["z"])[0, 1] > 0.95
    assert (predicted["k_predictions"] == df["k"]).mean() > 0.85
    metrics = model.evaluate(df)
    assert metrics["k/accuracy"] == pytest.approx((predicted["k_predictions"] == df["k"]).mean())
    assert metrics["y/accuracy"] == pytest.approx((predicted["y_predictions"] == df["y"]).mean())


def test_the_best_model_follows_the_named_output_s_metric(tmp_path):
    """``trainer.validation_field`` naming an output: the model kept is the epoch of that
    output's best ``validation_metric``, not of the best combined loss."""
    config = MULTI.replace("early_stop: -1}", "early_stop: -1, validation_field: k, validation_metric: accuracy}")
    out, rows, _ = _train(tmp_path, config)
    assert list(rows[0])[list(rows[0]).index("validation_loss") + 1] == "validation_k/accuracy"  # shown beside the loss
    accuracy = [row["validation_k/accuracy"] for row in rows]
    losses = [row["validation_loss"] for row in rows]
    assert out["evaluation"]["best_epoch"] == int(np.argmax(accuracy))
    assert int(np.argmax(accuracy)) != int(np.argmin(losses))  # else this test could not tell them apart


def test_each_output_s_loss_weight_scales_its_gradient(tmp_path):
    """With SGD, an output whose loss weight is a millionth barely moves from its
    initialisation, where at weight 1 it learns: the weights reach the loss trained on."""
    base = MULTI.replace("learning_rate: 0.01", "learning_rate: 0.05, optimizer: {type: sgd}").replace("epochs: 15", "epochs: 8")
    trained, _, _ = _train(tmp_path, base.replace("loss: {weight: 0.5}", "loss: {weight: 1}"), name="one")
    starved, _, _ = _train(tmp_path, base.replace("loss: {weight: 0.5}", "loss: {weight: 1.0e-6}"), name="tiny")
    assert trained["evaluation"]["test"]["z/r2"] > 0.8
    assert starved["evaluation"]["test"]["z/r2"] < 0.5
    assert starved["evaluation"]["test"]["y/accuracy"] > 0.85  # the other outputs still learn


def test_a_row_lacking_any_target_is_dropped(tmp_path):
    """A row with one output's value missing trains none of the outputs (Ludwig drops it)."""
    df = multi(100)
    df.loc[[3, 50], "z"] = None
    df.loc[[7], "k"] = None
    cfg, data = write(tmp_path, fmt="parquet", df=df, config=MULTI.replace("[0.7, 0.1, 0.2]", "[1.0, 0.0, 0.0]"))
    prepared = api.prepare(load_config(cfg), data)
    assert {len(v) for v in prepared.train.values()} == {97}


def test_a_one_output_model_saved_with_its_old_decoder_name_loads(tmp_path):
    """Models of one output written before outputs had a decoder each (format 1) named it
    ``decoder``: their weights still load and predict the same."""
    from safetensors.torch import load_file, save_file

    from raylight.declarative.train import load_model

    cfg, data = write(tmp_path, fmt="parquet", df=multi(), config=MULTI.replace(
        "  - {name: z, type: number, loss: {weight: 0.5}}\n  - {name: k, type: category}\n", ""
    ))
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    before = load_model(out["model_path"]).predict(multi(50, seed=3))
    path = f"{out['model_path']}/weights.safetensors"
    weights = load_file(path)
    assert {"decoders.y.weight", "decoders.y.bias"} <= set(weights)
    save_file({k.replace("decoders.y.", "decoder."): v for k, v in weights.items()}, path)
    model_json = Path(out["model_path"]) / "model.json"
    saved = json.loads(model_json.read_text())
    assert saved["format"] == 2
    model_json.write_text(json.dumps({**saved, "format": 1}))
    after = load_model(out["model_path"]).predict(multi(50, seed=3))
    assert after.equals(before)


def _config(**over):
    """MULTI's config as data, with the sections ``over`` gives replaced."""
    return {**yaml.safe_load(MULTI), **over}


def test_combined_has_only_the_loss_and_an_output_its_own_metrics():
    """With several outputs, combined's one metric is the loss; an output's name takes
    that output's metrics; a name that is no output lists the outputs."""
    cases = [
        ({"validation_field": "combined", "validation_metric": "accuracy"}, "of the combined outputs"),
        ({"validation_field": "z", "validation_metric": "accuracy"}, "output 'z' (number)"),
        ({"validation_field": "w", "validation_metric": "loss"}, "use 'y', 'z', 'k' or combined"),
    ]
    for trainer, words in cases:
        with pytest.raises(Exception, match=r"(?s)trainer\.validation_(metric|field)") as info:
            ModelConfig.model_validate(_config(trainer={"epochs": 2, **trainer}))
        assert words in " ".join(str(info.value).split()), info.value
    ok = ModelConfig.model_validate(_config(trainer={"validation_field": "z", "validation_metric": "mean_absolute_error"}))
    assert ok.trainer.validation_metric == "mae"
    ok = ModelConfig.model_validate(_config(trainer={"validation_field": "z", "validation_metric": "mean_absolute_percentage_error"}))
    assert ok.trainer.validation_metric == "mape"


def test_a_validation_metric_given_alone_follows_the_one_output_that_measures_it():
    """Ludwig's rule: without a validation_field, a metric only one output measures is that
    output's; one that several measure is an error naming them; the loss is combined's."""
    for metric, field in (("r2", "z"), ("mean_squared_error", "z"), ("root_mean_squared_percentage_error", "z"), ("roc_auc", "y"), ("loss", "combined")):
        config = ModelConfig.model_validate(_config(trainer={"validation_metric": metric}))
        assert config.trainer.validation_field == field, metric
    with pytest.raises(Exception, match=r"'accuracy' is measured on the outputs \['y', 'k'\]; set trainer.validation_field"):
        ModelConfig.model_validate(_config(trainer={"validation_metric": "accuracy"}))
    chosen = ModelConfig.model_validate(_config(trainer={"validation_metric": "accuracy", "validation_field": "k"}))
    assert chosen.trainer.validation_field == "k"


def test_hyperopt_reports_the_named_output_s_metric():
    """The metric a search follows is the output's own (``validation_k/accuracy``); an
    output's Ludwig ``loss.weight`` is a parameter it can search."""
    from raylight.declarative.hyperopt import trial_config

    hyperopt = {"metric": "accuracy", "goal": "maximize", "output_feature": "k",
                "parameters": {"z.loss.weight": {"space": "choice", "categories": [0.25, 2.0]}}}
    config = ModelConfig.model_validate(_config(hyperopt=hyperopt))
    assert config.hyperopt is not None and config.hyperopt.metric_name == "validation_k/accuracy"
    trial = trial_config(config.model_dump(mode="json"), {"z.loss.weight": 2.0})
    assert trial.output_features[1].loss_weight == 2.0
    combined = ModelConfig.model_validate(_config(hyperopt={**hyperopt, "output_feature": "combined", "metric": "loss", "goal": "minimize"}))
    assert combined.hyperopt is not None and combined.hyperopt.metric_name == "validation_loss"
    with pytest.raises(Exception, match="of the combined outputs"):
        ModelConfig.model_validate(_config(hyperopt={**hyperopt, "output_feature": "combined"}))


def test_ludwig_s_multi_task_keys():
    """Ludwig's loss.weight is the output's loss_weight (both, differing, is an error);
    an output that depends on another's, and loss balancing, are errors that say what
    raylight does instead."""
    ok = ModelConfig.model_validate(_config())
    assert [o.loss_weight for o in ok.output_features] == [1.0, 0.5, 1.0]
    outputs = _config()["output_features"]
    cases = [
        ({**outputs[1], "loss_weight": 2.0}, "output_features.1.loss.weight", "keep one"),
        ({**outputs[1], "dependencies": ["y"]}, "output_features.1.dependencies", "do not feed one another"),
    ]
    for changed, where, words in cases:
        with pytest.raises(Exception) as info:
            ModelConfig.model_validate(_config(output_features=[outputs[0], changed, outputs[2]]))
        text = " ".join(str(info.value).split())
        assert where in text and words in text, text
    # issue 56: Ludwig's strategies are accepted (raylight.declarative.loss_balancing); gradnorm is refused
    assert ModelConfig.model_validate(_config(trainer={"loss_balancing": "log_transform"})).trainer.loss_balancing == "log_transform"
    with pytest.raises(Exception, match="gradnorm is not available"):
        ModelConfig.model_validate(_config(trainer={"loss_balancing": "gradnorm"}))
    with pytest.raises(Exception, match="one binary output"):
        ModelConfig.model_validate(_config(preprocessing={"oversample_minority": 0.5}))


def test_a_missing_second_target_column_is_named(tmp_path):
    cfg, data = write(tmp_path, fmt="parquet", df=multi().drop(columns="k"), config=MULTI)
    with pytest.raises(ConfigError, match="feature 'k' needs column 'k'"):
        api.prepare(load_config(cfg), data)


def test_evaluate_data_adds_up_each_output_s_sums_across_parts():
    """Evaluated in two parts whose sums are added (processes a launcher started), the
    metrics of several outputs are those of all rows at once."""
    from types import SimpleNamespace

    from raylight.declarative import train as dtrain

    class Heads(torch.nn.Module):
        def forward(self, batch):
            return {"y": batch["x"][:, 0], "z": batch["x"][:, 1]}

    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 2)).astype(np.float32)
    arrays = {"x": x, "y": (rng.random(80) < 0.5).astype(np.float32), "z": rng.normal(size=80).astype(np.float32)}
    outputs = [SimpleNamespace(name="y", type="binary", threshold=0.5, loss_weight=2.0),
               SimpleNamespace(name="z", type="number", threshold=0.5, loss_weight=1.0)]
    meta = {"y": {}, "z": {"std": 3.0}}
    whole = dtrain.evaluate_data(Heads(), arrays, outputs, meta, torch.device("cpu"))
    halves = [{k: v[s] for k, v in arrays.items()} for s in (slice(0, 30), slice(30, None))]
    sums = []
    dtrain.evaluate_data(Heads(), halves[1], outputs, meta, torch.device("cpu"), reduce=lambda s: sums.append(s) or s)

    def add_other(mine):
        return {k: v + sums[0][k] for k, v in mine.items()}

    scored = np.stack([x[30:, 0].astype(np.float64), arrays["y"][30:].astype(np.float64)], 1)
    parted = dtrain.evaluate_data(Heads(), halves[0], outputs, meta, torch.device("cpu"), reduce=add_other,
                                  gather=lambda rows: np.concatenate([rows, scored]))
    assert parted == pytest.approx(whole, rel=1e-6)
    assert whole["loss"] == pytest.approx(2.0 * whole["y/loss"] + whole["z/loss"], rel=1e-12)


def test_ludwig_s_rendered_multi_task_config_trains(tmp_path):
    """tests/data/ludwig/multi_output.yaml, as Ludwig 0.17.10 wrote it: three outputs, z's
    loss.weight 0.5, early stopping on k's accuracy; it loads as that and trains each."""
    rendered = Path(__file__).parent.parent / "data" / "ludwig" / "multi_output.yaml"
    config = load_config(str(rendered), ["trainer.epochs=10"])
    assert [(o.name, o.type, o.loss_weight) for o in config.output_features] == [
        ("y", "binary", 1.0), ("z", "number", 0.5), ("k", "category", 1.0),
    ]
    assert (config.trainer.validation_field, config.trainer.validation_metric) == ("k", "accuracy")
    _, data = write(tmp_path, fmt="parquet", df=multi())
    out = api.train(config, data, output_directory=str(tmp_path / "run"), backend="local", progress=False)
    test = out["evaluation"]["test"]
    assert test["y/accuracy"] > 0.85 and test["z/r2"] > 0.8 and test["k/accuracy"] > 0.8, test
