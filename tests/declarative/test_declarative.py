"""Declarative training with the local backend (no Ray): config, data checks, train, predict."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import apply_overrides, load_config, render_config
from raylight.declarative.train import load_model
from tests.declarative_data import CONFIG, frame, write

CLI = [sys.executable, "-m", "raylight.cli"]


def run_cli(*args, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def bad_config(tmp_path, text):
    cfg, _ = write(tmp_path, config=text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    return str(err.value)


def test_unknown_key_names_the_path(tmp_path):
    text = bad_config(tmp_path, CONFIG.replace("dropout: 0.1", "dropuot: 0.1"))
    assert "combiner.dropuot: unknown key" in text


def test_wrong_type_names_the_path_and_value(tmp_path):
    text = bad_config(tmp_path, CONFIG.replace("epochs: 6", "epochs: six"))
    assert "trainer.epochs" in text and "'six'" in text


def test_unknown_feature_type_lists_the_allowed(tmp_path):
    text = bad_config(tmp_path, CONFIG.replace("{name: age, type: number}", "{name: age, type: numbr}"))
    assert "input_features.0" in text and "'numbr'" in text
    for allowed in ("'number'", "'category'", "'binary'", "'text'"):
        assert allowed in text


def test_overrides_and_render(tmp_path):
    cfg, _ = write(tmp_path)
    config = load_config(cfg, ["trainer.epochs=3", "input_features.0.preprocessing.normalization=minmax"])
    assert config.trainer.epochs == 3 and config.input_features[0].preprocessing.normalization == "minmax"
    rendered = render_config(config)
    assert "missing_value_strategy: fill_with_mean" in rendered and "embedding_size: 32" in rendered
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        apply_overrides({}, ["trainer.epochs"])
    with pytest.raises(ConfigError, match="not an index"):
        apply_overrides({"input_features": []}, ["input_features.3.name=x"])
    # a section written as null (left out) takes the override as a new section
    nulled = apply_overrides({"trainer": {"learning_rate_scheduler": None}}, ["trainer.learning_rate_scheduler.decay=cosine"])
    assert nulled == {"trainer": {"learning_rate_scheduler": {"decay": "cosine"}}}
    with pytest.raises(ConfigError, match=r"trainer\.epochs is a value, not a section"):
        apply_overrides({"trainer": {"epochs": 3}}, ["trainer.epochs.x=1"])


@pytest.mark.parametrize(
    "mutate,expected",
    [
        (lambda df: df.drop(columns=["workclass"]), "needs column 'workclass', which dataset"),
        (lambda df: df.assign(age=None), "column 'age' of dataset"),
        (lambda df: df.iloc[:0], "is empty: it has no rows"),
        (lambda df: df.assign(income=True), "has only one class"),
        (lambda df: df.assign(age=df["age"].astype(object).where(df.index != 5, "forty")), "holds non-numeric values such as ['forty'] (first at row 5)"),
    ],
    ids=["missing-column", "all-null", "empty", "one-class", "non-numeric"],
)
def test_bad_data_is_a_config_error_naming_the_column(tmp_path, mutate, expected):
    cfg, data = write(tmp_path, df=mutate(frame()))
    with pytest.raises(ConfigError) as err:
        api.prepare(load_config(cfg), data)
    assert expected in str(err.value)


def test_missing_dataset_path(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        api.prepare(load_config(write(tmp_path)[0]), str(tmp_path / "nope.csv"))
    with pytest.raises(ConfigError, match="unknown format"):
        api.prepare(load_config(write(tmp_path)[0]), str(tmp_path / "data.xlsx"))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_train_predict_evaluate_local(tmp_path, fmt):
    cfg, data = write(tmp_path, fmt=fmt)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "evaluation.json", "learning_curves.png", "model/model.json", "model/weights.safetensors"):
        assert (run / name).exists(), name
    assert out["evaluation"]["test"]["accuracy"] > 0.6
    model = load_model(str(run / "model"))
    df = frame(50, seed=1)
    pred = model.predict(df)
    assert len(pred) == 50 and list(pred.columns) == ["income_predictions", "income_probabilities"]
    assert pred["income_probabilities"].between(0, 1).all()
    # One row per input row, in order: a row's prediction does not depend on its neighbours.
    assert pred.iloc[7].tolist() == model.predict(df.iloc[[7]]).iloc[0].tolist()
    assert model.evaluate(df)["accuracy"] > 0.5


def test_gradient_clipping_takes_ludwig_s_global_norm_and_names_the_keys_it_does_not(tmp_path):
    """``trainer.gradient_clipping.clipglobalnorm`` clips every step: at 1e-9 an SGD model
    does not move (its validation loss stays), where unclipped it does; Ludwig's other two
    clips are errors at their key paths, and null is accepted."""
    losses = {}
    for clip in ("null", "1.0e-9"):
        config = CONFIG.replace("epochs: 6", "epochs: 2").replace("optimizer: {type: adam}", "optimizer: {type: sgd}")
        config = config.replace("early_stop: 5}", f"early_stop: 5, gradient_clipping: {{clipglobalnorm: {clip}, clipnorm: null}}}}")
        (tmp_path / clip).mkdir()
        cfg, data = write(tmp_path / clip, config=config)
        run = tmp_path / clip / "run"
        api.train(load_config(cfg), data, output_directory=str(run), progress=False)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses[clip] = [row["validation_loss"] for row in rows]
        assert "learning_rate" not in rows[0]  # reported with a learning_rate_scheduler only
    assert losses["1.0e-9"][0] == pytest.approx(losses["1.0e-9"][1], rel=1e-6)
    assert abs(losses["null"][1] - losses["null"][0]) > 1e-3
    for key in ("clipnorm", "clipvalue"):
        text = bad_config(tmp_path, CONFIG.replace("early_stop: 5}", f"early_stop: 5, gradient_clipping: {{{key}: 0.5}}}}"))
        assert f"trainer.gradient_clipping.{key}" in text and "set clipglobalnorm: 0.5 instead" in text
    text = bad_config(tmp_path, CONFIG.replace("early_stop: 5}", "early_stop: 5, gradient_clipping: {clipglobalnorm: 0}}"))
    assert "trainer.gradient_clipping.clipglobalnorm" in text


def test_ludwig_s_learning_rate_scheduler_sets_each_step_s_rate(tmp_path):
    """``trainer.learning_rate_scheduler`` (Ludwig's section, refused before): warm-up over
    the first epoch, then linear decay to 0 at the run's last step. Each epoch reports the
    rate of its last step: 280 training rows at batch 32 are 9 steps an epoch, so epoch e
    ends at step 9e + 8."""
    from raylight.declarative.lr_schedule import Schedule

    section = "learning_rate_scheduler: {decay: linear, warmup_evaluations: 1}"
    config = CONFIG.replace("epochs: 6", "epochs: 3").replace("early_stop: 5}", f"early_stop: 5, {section}}}")
    cfg, data = write(tmp_path, config=config)
    api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    schedule = Schedule(load_config(cfg).trainer.learning_rate_scheduler, base_lr=1e-3, total_steps=27, steps_per_epoch=9)
    assert [row["learning_rate"] for row in rows] == pytest.approx([schedule.lr(9 * e + 8) for e in range(3)])
    assert rows[0]["learning_rate"] == pytest.approx(1e-3 * 8 / 9)  # warming up
    assert rows[2]["learning_rate"] == pytest.approx(1e-3 * 1 / 18)  # the last of 18 decay steps


def test_validation_metric_chooses_the_best_model_and_when_to_stop(tmp_path):
    """``trainer.validation_metric`` (Ludwig's key, refused before): early stopping and the
    saved model follow it, rising metrics included. On this data the validation accuracy
    stops rising at epoch 2 while the loss keeps falling, so the two runs part ways."""
    runs = {}
    for metric in ("loss", "accuracy_micro"):
        (tmp_path / metric).mkdir()
        config = CONFIG.replace("epochs: 6", "epochs: 8").replace(
            "early_stop: 5}", f"early_stop: 2, validation_metric: {metric}, validation_field: income}}"
        )
        cfg, data = write(tmp_path / metric, config=config)
        out = api.train(load_config(cfg), data, output_directory=str(tmp_path / metric / "run"), progress=False)
        rows = [json.loads(line) for line in (tmp_path / metric / "run" / "metrics.jsonl").read_text().splitlines()]
        runs[metric] = (out["evaluation"]["best_epoch"], rows)
    best, rows = runs["loss"]
    losses = [r["validation_loss"] for r in rows]
    assert best == losses.index(min(losses))
    best, rows = runs["accuracy_micro"]  # Ludwig's name of raylight's accuracy
    accuracies = [r["validation_accuracy"] for r in rows]
    assert best == accuracies.index(max(accuracies))  # the first of the best
    assert len(rows) == 8 or rows[-1]["epoch"] - best == 2  # stopped 2 epochs without a gain
    losses = [r["validation_loss"] for r in rows]
    assert best != losses.index(min(losses)), "the data no longer tells accuracy from loss apart"
    for bad, words in (
        ("validation_metric: r2", "'r2' is not measured of a binary output; allowed: ['loss', 'accuracy', 'roc_auc', 'precision', 'recall', 'specificity']"),
        ("validation_field: target", "'target' is not an output feature; use 'income' or combined"),
    ):
        text = bad_config(tmp_path, CONFIG.replace("early_stop: 5}", f"early_stop: 5, {bad}}}"))
        assert words in text, text
    no_validation = CONFIG.replace("[0.7, 0.1, 0.2]", "[0.8, 0.0, 0.2]").replace("early_stop: 5}", "early_stop: 5, validation_metric: accuracy}")
    assert "without a validation split" in bad_config(tmp_path, no_validation)


def test_ludwig_s_regularization_adds_its_penalty_to_the_loss(tmp_path):
    """``trainer.regularization_lambda`` / ``regularization_type`` (Ludwig's, refused before):
    the penalty of each type as Ludwig's reg_loss computes it; in training, L2 at lambda
    with SGD is SGD's weight_decay at 2 x lambda, step for step (torch adds weight_decay x w
    to the gradient before momentum: the penalty's gradient, 2 x lambda x w)."""
    from raylight.declarative.train import regularization

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.fill_(3.0)
    assert regularization("l1", 0.1)(model).item() == pytest.approx(0.1 * 6)
    assert regularization("l2", 0.1)(model).item() == pytest.approx(0.1 * 14)
    assert regularization("l1_l2", 0.1)(model).item() == pytest.approx(0.1 * 20)
    assert regularization("l2", 0.0) is None and regularization(None, 0.1) is None
    losses = {}
    for name, section in (("penalty", "regularization_lambda: 0.05, regularization_type: l2"),
                          ("decay", "regularization_lambda: 0")):
        decay = 0.1 if name == "decay" else 0.0
        config = CONFIG.replace("epochs: 6", "epochs: 3").replace(
            "optimizer: {type: adam}", f"optimizer: {{type: sgd, weight_decay: {decay}}}"
        ).replace("early_stop: 5}", f"early_stop: 5, {section}}}")
        (tmp_path / name).mkdir()
        cfg, data = write(tmp_path / name, config=config)
        api.train(load_config(cfg), data, output_directory=str(tmp_path / name / "run"), progress=False)
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [row["validation_loss"] for row in rows]
    assert losses["penalty"] == pytest.approx(losses["decay"], rel=1e-5)
    plain = CONFIG.replace("optimizer: {type: adam}", "optimizer: {type: sgd}")
    cfg, data = write(tmp_path, config=plain.replace("epochs: 6", "epochs: 3"))
    api.train(load_config(cfg), data, output_directory=str(tmp_path / "plain"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert abs(rows[-1]["validation_loss"] - losses["penalty"][-1]) > 1e-4  # the penalty changes training
    fsdp = CONFIG.replace("early_stop: 5}", "early_stop: 5, regularization_lambda: 0.1}").replace(
        "backend: {type: local}", "backend: {type: local, trainer: {strategy: {type: fsdp}}}"
    )
    assert "not with backend.trainer.strategy fsdp" in bad_config(tmp_path, fsdp)


def test_cli_exit_codes_and_nothing_half_written(tmp_path):
    cfg, data = write(tmp_path, config=CONFIG.replace("epochs: 6", "epochs: 0"))
    out = tmp_path / "out"
    res = run_cli("train", "--config", cfg, "--dataset", data, "--output-directory", str(out))
    assert res.returncode == 2 and "trainer.epochs" in res.stderr
    assert not out.exists()
    (tmp_path / "valid").mkdir()
    valid, _ = write(tmp_path / "valid")
    missing = str(tmp_path / "missing.csv")
    for backend in ("local", "ray"):  # named before Ray starts (it was named after Ray's start, before)
        res = run_cli("train", "--config", valid, "--dataset", missing, "--backend", backend, "--verbose",
                      "--output-directory", str(out))
        assert res.returncode == 2 and f"dataset {missing!r} does not exist" in res.stderr, res.stderr
        assert "Ray instance" not in res.stderr and not out.exists(), res.stderr
    res = run_cli("train", "--config", cfg)
    assert res.returncode == 2 and "--dataset" in res.stderr  # usage error
    res = run_cli("render-config", "--config", cfg, "--set", "trainer.epochs=4")
    assert res.returncode == 0 and "epochs: 4" in res.stdout


def test_cli_train_predict_init_and_check(tmp_path):
    cfg, data = write(tmp_path)
    res = run_cli("check", "--config", cfg, "--dataset", data)
    assert res.returncode == 0 and "training rows" in res.stderr
    res = run_cli("init-config", "--dataset", data, "--target", "income")
    assert res.returncode == 0
    assert "name: income" in res.stdout and "type: binary" in res.stdout and "type: text" in res.stdout
    out = tmp_path / "run"
    res = run_cli("train", "--config", cfg, "--dataset", data, "--output-directory", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    preds = tmp_path / "p.parquet"
    res = run_cli("predict", "--model-path", str(out / "model"), "--dataset", data, "--output", str(preds))
    assert res.returncode == 0, res.stderr
    assert len(pd.read_parquet(preds)) == len(pd.read_csv(data))
    res = run_cli("predict", "--model-path", str(tmp_path), "--dataset", data)
    assert res.returncode == 2 and "not a raylight model directory" in res.stderr
    assert os.path.exists(out / "evaluation.json")


def test_cache_dir_reuses_preprocessing_until_config_or_data_change(tmp_path):
    import fsspec

    cfg_text = CONFIG.replace("backend: {type: local}", "backend: {type: local, cache_dir: 'memory://rl-cache'}")
    cfg, data = write(tmp_path, config=cfg_text)
    config = load_config(cfg)
    first = api.prepare(config, data)
    fs = fsspec.filesystem("memory")
    entries = fs.ls("/rl-cache")
    assert len(entries) == 1 and fs.exists(entries[0]["name"] + "/meta.json")
    again = api.prepare(config, data)
    assert again.meta == first.meta and (again.train["age"] == first.train["age"]).all()
    api.prepare(load_config(cfg, ["input_features.0.preprocessing.normalization=minmax"]), data)
    assert len(fs.ls("/rl-cache")) == 2, "a different preprocessing config is a different entry"


def test_dataset_globs_and_fsspec_uris(tmp_path):
    import fsspec

    df = frame()
    with fsspec.open("memory://rl-data/part-0.csv", "w") as f:
        df.iloc[:200].to_csv(f, index=False)
    with fsspec.open("memory://rl-data/part-1.csv", "w") as f:
        df.iloc[200:].to_csv(f, index=False)
    cfg, _ = write(tmp_path)
    prepared = api.prepare(load_config(cfg), "memory://rl-data/part-*.csv")
    total = sum(len(next(iter(p.values()))) for p in (prepared.train, prepared.validation, prepared.test) if p)
    assert total == len(df)


class _Passthrough(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sizes = []

    def forward(self, batch):
        self.sizes.append(len(batch["x"]))
        return {"y": batch["x"]}


@pytest.mark.parametrize("kind", ["category", "number"])
def test_streamed_evaluation_equals_the_metrics_of_all_rows_at_once(kind, monkeypatch):
    from types import SimpleNamespace

    from raylight.declarative import train as dtrain
    from raylight.declarative.ray_data import BlockRefs

    rng = np.random.default_rng(0)
    n = 103
    if kind == "category":
        arrays = {"x": rng.normal(size=(n, 4)).astype(np.float32), "y": rng.integers(0, 4, n)}
    else:
        arrays = {"x": rng.normal(size=n).astype(np.float32), "y": rng.normal(size=n).astype(np.float32)}
    output, meta = SimpleNamespace(name="y", type=kind, threshold=0.5, top_k=3, loss=SimpleNamespace(type="softmax_cross_entropy")), {"y": {"std": 2.0, "mean": 0.5, "classes": list("abcd")}}
    x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
    if kind == "category":
        expected = {
            "loss": float(torch.nn.functional.cross_entropy(x, y)), "accuracy": float((x.argmax(1) == y).float().mean()),
            "hits_at_k": float((x.argsort(1, descending=True)[:, :3] == y[:, None]).any(1).float().mean()),
        }
    else:
        err = ((x - y) * 2.0).double()
        var = float(((y - y.mean()) * 2.0).double().pow(2).mean())
        truth = (y * 2.0 + 0.5).double()  # the target in its own units: percentage errors divide by it
        expected = {"loss": float(((x - y) ** 2).mean()), "mse": float(err.pow(2).mean()), "mae": float(err.abs().mean()), "r2": 1 - float(err.pow(2).mean()) / var,
                    "rmse": float(err.pow(2).mean()) ** 0.5, "mape": float((err.abs() / truth.abs()).mean()),
                    "rmspe": float((err / truth).pow(2).mean()) ** 0.5}
    monkeypatch.setattr(dtrain, "EVAL_ROWS", 10)  # 11 chunks
    model = _Passthrough()
    chunked = dtrain.evaluate_data(model, arrays, output, meta, torch.device("cpu"))
    assert chunked == pytest.approx(expected, rel=1e-5) and model.sizes == [10] * 10 + [3]
    blocks = [{k: v[lo : lo + 40] for k, v in arrays.items()} for lo in range(0, n, 40)]
    refs = BlockRefs(blocks, [len(b["y"]) for b in blocks])
    monkeypatch.setattr("raylight.worker.data.blocks._ray_get", lambda b: b)
    model = _Passthrough()
    assert dtrain.evaluate_data(model, refs, output, meta, torch.device("cpu"), chunk_rows=15) == pytest.approx(expected, rel=1e-5)
    assert model.sizes == [15, 15, 10, 15, 15, 10, 15, 8]  # trainer.eval_batch_size rows at a time, within each block


@pytest.mark.parametrize("seed", range(4))
def test_roc_auc_is_the_share_of_positive_negative_pairs_ranked_right(seed):
    """A binary output's ``roc_auc`` (Ludwig's default validation metric for binary
    outputs): over every (positive, negative) pair, 1 if the positive scores higher, 1/2
    on a tie; streamed in chunks and, gathered from two shares, the same number."""
    from types import SimpleNamespace

    from raylight.declarative import train as dtrain
    from raylight.declarative.outputs.binary import roc_auc

    rng = np.random.default_rng(seed)
    n = 301
    x = rng.integers(-5, 6, n).astype(np.float32)  # few distinct scores: many ties
    y = (rng.random(n) < 1 / (1 + np.exp(-x / 2))).astype(np.float32)
    pos, neg = x[y == 1], x[y == 0]
    expected = float(((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean())
    assert roc_auc(x, y) == pytest.approx(expected, abs=1e-12)
    output, meta = SimpleNamespace(name="y", type="binary", threshold=0.5), {"y": {}}
    model = _Passthrough()
    metrics = dtrain.evaluate_data(model, {"x": x, "y": y}, output, meta, torch.device("cpu"), chunk_rows=50)
    assert metrics["roc_auc"] == pytest.approx(expected, abs=1e-12) and len(model.sizes) == 7
    halves = [dtrain.evaluate_data(_Passthrough(), {"x": x[s], "y": y[s]}, output, meta, torch.device("cpu"),
                                   gather=lambda rows, other=other: np.concatenate([rows, other]))
              for s, other in ((slice(0, 150), np.stack([x[150:], y[150:]], 1)), (slice(150, None), np.stack([x[:150], y[:150]], 1)))]
    assert [h["roc_auc"] for h in halves] == pytest.approx([expected, expected], abs=1e-12)
    assert roc_auc(x, np.ones_like(y)) == 0.5  # one class: undefined


@pytest.mark.parametrize("threshold", [0.5, 0.7])
def test_binary_precision_recall_and_specificity_count_the_predictions_at_the_threshold(threshold):
    """Ludwig's binary precision, recall and specificity, of the rows predicted true at the
    output's threshold, streamed in chunks: the shares counted here from the predictions."""
    from types import SimpleNamespace

    from raylight.declarative import train as dtrain

    rng = np.random.default_rng(1)
    x = rng.normal(size=203).astype(np.float32)
    y = (rng.random(203) < 1 / (1 + np.exp(-2 * x))).astype(np.float32)
    predicted = (1 / (1 + np.exp(-x)) >= threshold).astype(int)
    output = SimpleNamespace(name="y", type="binary", threshold=threshold)
    metrics = dtrain.evaluate_data(_Passthrough(), {"x": x, "y": y}, output, {"y": {}}, torch.device("cpu"), chunk_rows=40)
    true, said = y == 1, predicted == 1
    assert metrics["precision"] == pytest.approx(true[said].mean(), abs=1e-12)  # of the rows predicted true, the true
    assert metrics["recall"] == pytest.approx(said[true].mean(), abs=1e-12)  # of the true rows, those predicted
    assert metrics["specificity"] == pytest.approx((~said[~true]).mean(), abs=1e-12)  # of the false rows, those predicted false
    none = dtrain.evaluate_data(_Passthrough(), {"x": -np.ones(5, np.float32), "y": np.ones(5, np.float32)}, output, {"y": {}}, torch.device("cpu"))
    assert (none["precision"], none["recall"], none["specificity"]) == (0.0, 0.0, 0.0)  # undefined: 0, as torchmetrics'


def test_hits_at_k_is_measured_with_more_classes_than_top_k(tmp_path):
    """As Ludwig: a category output with no more classes than top_k (every row's class is
    among the top k) does not measure hits_at_k, and a config that follows it there is an
    error, before anything is written."""
    config = CONFIG.replace("{name: income, type: binary}", "{name: workclass2, type: category}").replace(
        "  - {name: workclass, type: category}\n", ""
    )
    df = frame().assign(workclass2=lambda d: d["workclass"])  # three classes
    cfg, data = write(tmp_path, df=df, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert "hits_at_k" not in out["evaluation"]["test"] and "accuracy" in out["evaluation"]["test"]
    two = config.replace("{name: workclass2, type: category}", "{name: workclass2, type: category, top_k: 2}")
    cfg, data = write(tmp_path, df=df, config=two)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run2"), progress=False)
    assert 0 <= out["evaluation"]["test"]["hits_at_k"] <= 1
    follow = config.replace("early_stop: 5}", "early_stop: 5, validation_metric: hits_at_k}")
    cfg, data = write(tmp_path, df=df, config=follow)
    with pytest.raises(ConfigError, match=r"trainer.validation_metric: hits_at_k of output 'workclass2'.*has 3 classes"):
        api.train(load_config(cfg), data, output_directory=str(tmp_path / "run3"), progress=False)
    assert not (tmp_path / "run3").exists()


def test_top_k_is_a_category_output_s_setting():
    from raylight.declarative.config.model import ModelConfig

    def config(out):
        return {"input_features": [{"name": "a", "type": "number"}], "output_features": [out]}

    assert ModelConfig.model_validate(config({"name": "c", "type": "category", "top_k": 1})).output_features[0].top_k == 1
    with pytest.raises(Exception, match=r"output_features\.0\.top_k\n  a category output's setting; a binary output has none"):
        ModelConfig.model_validate(config({"name": "c", "type": "binary", "top_k": 2}))


def test_ludwig_s_optimizers_and_their_settings_build_torch_s():
    """Every ``trainer.optimizer.type`` (Ludwig's torch optimizers) builds its torch class
    with the settings given and torch's defaults for the rest (SGD's momentum: raylight's
    0.9); a setting of another type is an error naming it; ``learning_rate: auto`` is the
    class's default in torch (SGD's 0.05)."""
    import inspect

    from raylight.declarative.api import DEFAULT_LR
    from raylight.declarative.config.trainer import OPTIMIZER_SETTINGS, OptimizerConfig
    from raylight.declarative.train import OPTIMIZERS

    param = [torch.nn.Parameter(torch.zeros(2))]
    assert set(OPTIMIZERS) == set(OPTIMIZER_SETTINGS) == set(DEFAULT_LR)
    for name, cls in OPTIMIZERS.items():
        default = inspect.signature(cls).parameters["lr"].default
        assert DEFAULT_LR[name] == (0.05 if name == "sgd" else default), name
        if name == "muon":  # torch's Muon takes 2-D weights only (tests/declarative/test_optimizers.py)
            continue
        opt = cls(param, lr=0.1, **OptimizerConfig(type=name).kwargs())
        group = opt.param_groups[0]
        torch_defaults = cls(param, lr=0.1).defaults
        for key in OPTIMIZER_SETTINGS[name]:
            assert group[key] == (0.9 if (name, key) == ("sgd", "momentum") else torch_defaults[key]), (name, key)
    given = {"type": "adamw", "betas": [0.8, 0.95], "eps": 1e-6, "amsgrad": True, "weight_decay": 0.01}
    group = torch.optim.AdamW(param, lr=0.1, **OptimizerConfig.model_validate(given).kwargs()).param_groups[0]
    assert (group["betas"], group["eps"], group["amsgrad"], group["weight_decay"]) == ((0.8, 0.95), 1e-6, True, 0.01)
    group = torch.optim.RMSprop(param, lr=0.1, **OptimizerConfig(type="rmsprop", momentum=0.5, centered=True).kwargs()).param_groups[0]
    assert (group["momentum"], group["centered"]) == (0.5, True)
    for bad, words in (
        ({"type": "sgd", "betas": [0.9, 0.99]}, "betas is a setting of adam, adamw, adamax, nadam, radam, schedule_free_adamw, not of sgd"),
        ({"type": "adam", "momentum": 0.5}, "momentum is a setting of sgd, rmsprop, muon, not of adam"),
        ({"type": "sgd", "nesterov": True, "momentum": 0}, "nesterov needs momentum > 0"),
        ({"type": "soap"}, "'lbfgs'"),
    ):
        with pytest.raises(ValidationError) as err:
            OptimizerConfig.model_validate(bad)
        assert words in str(err.value), str(err.value)


def test_an_rmsprop_config_trains(tmp_path):
    config = CONFIG.replace("epochs: 6", "epochs: 2").replace(
        "optimizer: {type: adam}", "optimizer: {type: rmsprop, momentum: 0.5, alpha: 0.9}, learning_rate_scheduler: {}"
    )
    cfg, data = write(tmp_path, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["learning_rate"] == 0.01  # torch's default for RMSprop, constant (decay: null)
    assert out["evaluation"]["test"]["accuracy"] > 0.5


def test_text_keeps_max_sequence_length_tokens_of_each_row(tmp_path):
    """Ludwig's ``preprocessing.max_sequence_length`` on text (raylight's width was fixed
    at 64): each row keeps its first N tokens, in training and in a loaded model."""
    from raylight.declarative.features import text

    feat = text.TextInput(name="t", type="text", preprocessing={"max_sequence_length": 3})
    meta = text.fit(pd.Series(["a b c d e", "b"]), feat)
    ids, _ = text.transform(pd.Series(["a b c d e", "b", None]), feat, meta)
    vocab = meta["vocab"]
    assert ids.shape == (3, 3)
    assert [vocab[i] for i in ids[0]] == ["a", "b", "c"] and [vocab[i] for i in ids[1]][:1] == ["b"] and not ids[2].any()
    config = CONFIG.replace("epochs: 6", "epochs: 1").replace(
        "{name: review, type: text}", "{name: review, type: text, preprocessing: {max_sequence_length: 2}}"
    )
    cfg, data = write(tmp_path, config=config)
    api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    model = load_model(str(tmp_path / "run" / "model"))
    assert model.config.input_features[3].preprocessing.max_sequence_length == 2
    assert len(model.predict(frame(5, seed=2))) == 5


@pytest.mark.parametrize(
    ("tokenizer", "tokens"),
    [
        ("words", ["don", "t", "stop", "me_now", "ok"]),
        ("space_punct", ["don", "'", "t", "stop", ",", "me_now", "!", "ok", "."]),
        ("space", ["don't", "stop,", "me_now!", "ok."]),
        ("underscore", ["don't stop, me", "now! ok."]),
        ("comma", ["don't stop", "me_now! ok."]),
        ("characters", list("don't")),
    ],
)
def test_each_tokenizer_splits_as_ludwig_s_of_that_name(tokenizer, tokens):
    """Ludwig's tokenizers (``ludwig.utils.tokenizers``): space_punct keeps each punctuation
    mark as a token, space splits on white space, underscore and comma on their character
    (spaces around it dropped), characters gives each character; raylight's default, words,
    keeps runs of word characters. Each is used to fit the vocabulary and to transform."""
    from raylight.declarative.features import text

    text_in = "don't" if tokenizer == "characters" else "  don't stop, me_now! ok. "
    feat = text.TextInput(name="t", type="text", preprocessing={"tokenizer": tokenizer, "lowercase": False})
    assert text.tokenize(text_in, feat.preprocessing) == tokens
    meta = text.fit(pd.Series([text_in]), feat)
    assert sorted(meta["vocab"][2:]) == sorted(set(tokens))
    ids, _ = text.transform(pd.Series([text_in]), feat, meta)
    assert [meta["vocab"][i] for i in ids[0] if i] == tokens[: feat.preprocessing.max_sequence_length]


def test_train_steps_is_the_run_s_budget_and_its_schedule_s_length(tmp_path):
    """Ludwig's ``trainer.train_steps`` overrides the epochs: 13 steps of 9 an epoch are two
    epochs, the second stopped after 4 steps; a linear decay spans the 13 steps, so the last
    step (step 12) runs at 1/13 of the rate."""
    section = "train_steps: 13, learning_rate_scheduler: {decay: linear}"
    config = CONFIG.replace("early_stop: 5}", f"early_stop: 5, {section}}}")
    cfg, data = write(tmp_path, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1] and out["evaluation"]["epochs_run"] == 2
    assert rows[0]["learning_rate"] == pytest.approx(1e-3 * 5 / 13)  # step 8
    assert rows[1]["learning_rate"] == pytest.approx(1e-3 * 1 / 13)  # step 12, the last
    assert rows[1]["early_stop"] is True


def test_loss_weight_scales_the_loss_trained_on(tmp_path):
    """``loss_weight`` (Ludwig's loss.weight) multiplies the loss in training: with SGD, a
    weight of 2 trains as twice the learning rate; the reported losses stay unweighted."""
    losses = {}
    for name, weight, lr in (("weighted", 2, 0.01), ("faster", 1, 0.02)):
        config = CONFIG.replace("epochs: 6", "epochs: 2").replace("learning_rate: auto", f"learning_rate: {lr}").replace(
            "optimizer: {type: adam}", "optimizer: {type: sgd}"
        ).replace("{name: income, type: binary}", f"{{name: income, type: binary, loss_weight: {weight}}}")
        (tmp_path / name).mkdir()
        cfg, data = write(tmp_path / name, config=config)
        api.train(load_config(cfg), data, output_directory=str(tmp_path / name / "run"), progress=False)
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [row[key] for row in rows for key in ("train_loss", "validation_loss")]
    assert losses["weighted"] == pytest.approx(losses["faster"], rel=1e-5)


def test_ludwig_s_fixed_split_takes_each_row_s_split_from_its_column(tmp_path):
    """``preprocessing.split: {type: fixed, column: split}`` (Ludwig's): rows marked 0, 1, 2
    (numbers or their strings) go to train, validation and test, in file order; other
    values, a missing column, settings of the other type, and a run that needs validation
    rows the column does not give are errors that say so."""
    from raylight.declarative.config.preprocessing import SplitConfig
    from raylight.declarative.preprocess import coded_split_rows

    df = frame()
    df["split"] = [0] * 300 + ["1"] * 40 + [2.0] * 60
    fixed = CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: fixed}")
    cfg, data = write(tmp_path, config=fixed, df=df)
    prepared = api.prepare(load_config(cfg), data)
    assert [len(prepared.train["income"]), len(prepared.validation["income"]), len(prepared.test["income"])] == [300, 40, 60]
    assert prepared.test_frame["age"].tolist() == pytest.approx(df["age"].iloc[340:].tolist(), nan_ok=True)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] > 0.6
    with pytest.raises(ConfigError, match=r"holds values other than 0 \(train\).*such as \['x'\] \(first at row 3\)"):
        coded_split_rows(df.assign(split=[0, 0, 1, "x"] + [0] * 396), SplitConfig(type="fixed"), "d.csv")
    with pytest.raises(ConfigError, match="has no such column"):
        coded_split_rows(df, SplitConfig(type="fixed", column="fold"), "d.csv")
    assert "probabilities is a setting of types random, stratify, hash and datetime" in bad_config(
        tmp_path, CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]", "{type: fixed, probabilities: [0.8, 0.1, 0.1]")
    )
    assert "column is a setting of types fixed, stratify, hash and datetime" in bad_config(tmp_path, CONFIG.replace("{type: random,", "{type: random, column: s,"))
    (tmp_path / "noval").mkdir()
    cfg, data = write(tmp_path / "noval", config=fixed.replace("early_stop: 5}", "early_stop: 5, validation_metric: accuracy}"),
                      df=df.assign(split=[0] * 340 + [2] * 60))
    with pytest.raises(ConfigError, match=r"gives the validation split no rows, but trainer\.validation_metric \(accuracy\) needs one"):
        api.prepare(load_config(cfg), data)


def test_ludwig_s_hash_split_keeps_the_rows_of_one_value_together_in_every_run(tmp_path):
    """``preprocessing.split: {type: hash, column: id}`` (Ludwig's): each row's split is a
    function of its id alone: every id's rows sit in one split, the same in every run and
    whatever other rows the file has; the fractions are the probabilities' (by chance, as
    the ids fall); 5 and 5.0 (an integer column read with nulls) are one id."""
    from raylight.declarative.preprocess import hash_codes

    ids = pd.Series(np.arange(20_000) // 4)  # 5,000 ids of 4 rows each
    codes = hash_codes(ids, (0.7, 0.1, 0.2))
    assert all(len(set(c)) == 1 for c in codes.reshape(-1, 4))  # an id's rows stay together
    assert np.bincount(codes, minlength=3) / len(codes) == pytest.approx([0.7, 0.1, 0.2], abs=0.02)
    assert (hash_codes(ids[::-1], (0.7, 0.1, 0.2)) == codes[::-1]).all()  # by value, not position
    assert (hash_codes(ids.astype(float).where(ids > 0), (0.7, 0.1, 0.2))[4:] == codes[4:]).all()
    assert (hash_codes(ids.astype(str), (0.7, 0.1, 0.2)) == codes).all()
    assert not (hash_codes(ids, (0.1, 0.1, 0.8)) == codes).all()  # the probabilities pick the split
    df = frame()
    df["user"] = [f"u{i // 5}" for i in range(len(df))]
    config = CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: hash, column: user, probabilities: [0.6, 0.2, 0.2]}")
    cfg, data = write(tmp_path, config=config, df=df)
    prepared = api.prepare(load_config(cfg), data)
    test_users = set(df["user"][hash_codes(df["user"], (0.6, 0.2, 0.2)) == 2])
    assert set(prepared.test_frame["user"]) == test_users and prepared.test_frame["user"].value_counts().eq(5).all()
    sizes = [len(prepared.train["income"]), len(prepared.validation["income"]), len(prepared.test["income"])]
    assert sum(sizes) == len(df) and sizes[1] > 0 and sizes[0] > sizes[1]
    assert "hash needs column" in bad_config(tmp_path, CONFIG.replace("{type: random,", "{type: hash,"))


def test_ludwig_s_datetime_split_trains_on_the_earliest_rows_and_tests_on_the_latest(tmp_path):
    """``preprocessing.split: {type: datetime, column: when}`` (Ludwig's): the rows in
    order of their dates (ties in file order), the first 70% train, the next 10%
    validation, the last 20% test, by probabilities; dates in any format pandas reads
    (zones as UTC); a value that is not a date, or no date, is an error naming the column."""
    from raylight.declarative.preprocess import date_codes

    assert date_codes(np.array([5, 1, 3, 3, 0, 9, 7, 2, 8, 6]), (0.5, 0.2, 0.3)).tolist() == [1, 0, 0, 0, 0, 2, 2, 0, 2, 1]
    assert date_codes(np.array([1, 1, 1, 1]), (0.5, 0.25, 0.25)).tolist() == [0, 0, 1, 2]  # ties: file order
    df = frame()
    days = np.random.default_rng(5).permutation(len(df))
    df["when"] = [str(pd.Timestamp("2020-01-01") + pd.Timedelta(days=int(d))) for d in days]
    df.loc[3, "when"] = "2020-01-01T03:00:00+05:00"  # 2019-12-31 22:00 UTC: the earliest
    config = CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: datetime, column: when}")
    cfg, data = write(tmp_path, config=config, df=df)
    prepared = api.prepare(load_config(cfg), data)
    sizes = [len(prepared.train["income"]), len(prepared.validation["income"]), len(prepared.test["income"])]
    assert sizes == [280, 40, 80]
    test_days = sorted(days[prepared.test_frame.index])
    assert test_days == list(range(320, 400)) and 3 not in prepared.test_frame.index
    (tmp_path / "bad").mkdir()
    cfg, data = write(tmp_path / "bad", config=config, df=df.assign(when=["2020-01-01"] * 399 + ["soon"]))
    with pytest.raises(ConfigError, match=r"preprocessing\.split\.column 'when'.*not dates, such as \['soon'\]"):
        api.prepare(load_config(cfg), data)
    cfg, data = write(tmp_path / "bad", config=config, df=df.assign(when=[None] + ["2020-01-01"] * 399))
    with pytest.raises(ConfigError, match=r"1 row\(s\) of dataset .* have no date"):
        api.prepare(load_config(cfg), data)
    assert "datetime needs column" in bad_config(tmp_path, CONFIG.replace("{type: random,", "{type: datetime,"))


def test_ludwig_s_sample_ratio_and_size_train_on_a_seeded_sample_of_the_rows(tmp_path):
    """``preprocessing.sample_ratio`` / ``sample_size`` (Ludwig's): that share (or that many)
    of the rows, drawn at random by the seed before the split, are split and trained on."""
    df = frame()
    df["row"] = np.arange(len(df))

    def prepared_rows(section, seed=42):
        config = CONFIG.replace("preprocessing: {split:", f"preprocessing: {{{section}split:").replace(
            "early_stop: 5}", f"early_stop: 5, seed: {seed}}}"
        )
        (tmp_path / section.strip(", :")).mkdir(exist_ok=True)
        cfg, data = write(tmp_path / section.strip(", :"), config=config, df=df)
        prepared = api.prepare(load_config(cfg), data, use_cache=False)
        sizes = [len(s["income"]) for s in (prepared.train, prepared.validation, prepared.test)]
        return sizes, set(prepared.test_frame["row"])

    assert "early_stop: 5}" in CONFIG and "preprocessing: {split:" in CONFIG
    full, full_test = prepared_rows("")
    assert sum(full) == 400
    half, half_test = prepared_rows("sample_ratio: 0.5, ")
    assert sum(half) == 200 and half == [140, 20, 40]
    assert half_test != full_test and half_test < set(range(400))
    assert prepared_rows("sample_ratio: 0.5, ")[1] == half_test  # seeded
    assert prepared_rows("sample_ratio: 0.5, ", seed=7)[1] != half_test
    assert sum(prepared_rows("sample_size: 100, ")[0]) == 100
    assert sum(prepared_rows("sample_size: 1000, ")[0]) == 400  # more than there are: all
    assert "sample_size cannot be used with sample_ratio < 1" in bad_config(
        tmp_path, CONFIG.replace("preprocessing: {split:", "preprocessing: {sample_ratio: 0.5, sample_size: 10, split:")
    )
    with pytest.raises(ConfigError, match=r"preprocessing\.sample_ratio: 0\.001 of the 400 rows .* keeps none"):
        prepared_rows("sample_ratio: 0.001, ")


@pytest.mark.parametrize("blocks", [1, 3])
def test_class_balancing_quotas_give_ludwig_s_class_sizes_over_any_blocks(blocks):
    """Ludwig's oversample_minority (the minority drawn with replacement to ratio x the
    majority) and undersample_majority (the majority kept down to minority / ratio)."""
    from raylight.declarative.preprocess import balance_block, balance_quotas, class_counts

    y = np.array([1] * 30 + [0] * 70, dtype=np.float32)
    parts = np.array_split(np.random.default_rng(0).permutation(100), blocks)
    arrays = [{"y": y[p], "row": p} for p in parts]
    counts = np.stack([class_counts(a, "y") for a in arrays])
    for over, under, expected in ((1.0, None, (70, 70)), (0.5, None, (35, 70)), (None, 1.0, (30, 30)), (None, 0.5, (30, 60)),
                                  (None, 0.1, (30, 70))):  # never more of the majority than it has
        minority, quotas = balance_quotas(counts, over, under, (1, 4))
        assert minority == 1 and tuple(quotas.sum(axis=0)) == expected
        out = [balance_block(a, "y", minority, q, over is not None, (1, 4, i)) for i, (a, q) in enumerate(zip(arrays, quotas, strict=True))]
        ys = np.concatenate([o["y"] for o in out])
        rows = np.concatenate([o["row"] for o in out])
        assert (np.count_nonzero(ys == 1), np.count_nonzero(ys == 0)) == expected
        assert (y[rows] == ys).all()  # every row one of the block's own, label and all
        if under is not None:
            assert len(set(rows.tolist())) == len(rows)  # without replacement
            assert (quotas[:, 1] <= counts[:, 0]).all()
    with pytest.raises(ConfigError, match="training split holds one class only"):
        balance_quotas(np.array([[10, 0]]), 1.0, None, (1, 4))


def test_ludwig_s_class_balancing_changes_the_training_split_only(tmp_path):
    """``preprocessing.oversample_minority`` / ``undersample_majority`` on a binary output:
    the training split's classes balanced from its own rows; validation and test as they
    were; not with two of them, nor for another output type."""
    df = frame()
    df["income"] = np.arange(len(df)) % 4 == 0  # a quarter positive

    def prep(section):
        config = CONFIG.replace("preprocessing: {split:", f"preprocessing: {{{section}split:")
        (tmp_path / section.strip(", :")).mkdir(exist_ok=True)
        cfg, data = write(tmp_path / section.strip(", :"), config=config, df=df)
        return api.prepare(load_config(cfg), data, use_cache=False)

    plain = prep("")
    ones = int(plain.train["income"].sum())
    zeros = len(plain.train["income"]) - ones
    assert zeros > 2 * ones
    for section, expected in (("oversample_minority: 1, ", (zeros, zeros)), ("undersample_majority: 1, ", (ones, ones))):
        balanced = prep(section)
        y = balanced.train["income"]
        assert (int((y == 0).sum()), int(y.sum())) == expected
        assert set(balanced.train["age"].ravel().round(6)) <= set(plain.train["age"].ravel().round(6))
        for split in ("validation", "test"):
            assert (getattr(balanced, split)["age"] == getattr(plain, split)["age"]).all()
    both = CONFIG.replace("preprocessing: {split:", "preprocessing: {oversample_minority: 1, undersample_majority: 1, split:")
    assert "cannot both be set" in bad_config(tmp_path, both)
    number = CONFIG.replace("preprocessing: {split:", "preprocessing: {oversample_minority: 1, split:").replace(
        "{name: income, type: binary}", "{name: income, type: number}"
    )
    assert "preprocessing.oversample_minority: balances a binary output's two classes, but output 'income' is number" in bad_config(
        tmp_path, number
    )


def test_ludwig_s_stratified_split_keeps_each_value_s_proportions(tmp_path):
    """``preprocessing.split: {type: stratify, column: c}`` (Ludwig's): the random split's
    fractions within each value of the column, so every split keeps the proportions."""
    from raylight.declarative.preprocess import stratified_split_rows

    values = pd.Series(["a"] * 70 + ["b"] * 30 + [None] * 10)
    parts = stratified_split_rows(values, (0.7, 0.1, 0.2), seed=3)
    counts = [values.iloc[idx].fillna("<null>").value_counts().to_dict() for idx in parts]
    assert counts == [{"a": 49, "b": 21, "<null>": 7}, {"a": 7, "b": 3, "<null>": 1}, {"a": 14, "b": 6, "<null>": 2}]
    assert sorted(np.concatenate(parts).tolist()) == list(range(110))  # every row once
    assert all((a == b).all() for a, b in zip(parts, stratified_split_rows(values, (0.7, 0.1, 0.2), seed=3), strict=True))
    stratify = CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: stratify, column: workclass}")
    cfg, data = write(tmp_path, config=stratify)
    prepared = api.prepare(load_config(cfg), data)
    assert len(prepared.train["income"]) + len(prepared.validation["income"]) + len(prepared.test["income"]) == 400
    assert "stratify needs column" in bad_config(tmp_path, CONFIG.replace("{type: random,", "{type: stratify,"))
    (tmp_path / "colour").mkdir()
    cfg, data = write(tmp_path / "colour", config=stratify.replace("column: workclass", "column: colour"))
    with pytest.raises(ConfigError, match="no such column to stratify on"):
        api.prepare(load_config(cfg), data)


def test_a_config_ludwig_rendered_trains_on_roc_auc(tmp_path):
    """Ludwig 0.17.10's rendered config for these columns (tests/data/ludwig) trains as it
    is: its binary output's validation metric, roc_auc, is measured every epoch and picks
    the saved model."""
    import os

    rendered = os.path.join(os.path.dirname(__file__), "..", "data", "ludwig", "tabular_binary.yaml")
    config = load_config(rendered, ["trainer.epochs=2"])
    assert config.trainer.validation_metric == "roc_auc"
    _, data = write(tmp_path)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    aucs = [row["validation_roc_auc"] for row in rows]
    assert len(aucs) == 2 and all(0.5 < a <= 1 for a in aucs)
    assert out["evaluation"]["test"]["roc_auc"] > 0.6


def test_an_output_s_threshold_decides_its_predictions_and_the_accuracy_counting_them(tmp_path):
    """A binary output's ``threshold`` (Ludwig's): true at that probability and above, in
    ``predict`` and in the accuracy ``evaluate`` reports (roc_auc does not move); a
    threshold on a number output is an error naming it."""
    from raylight.declarative.train import load_model

    cfg, data = write(tmp_path)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    model = load_model(out["model_path"])
    df = frame(300, seed=5)
    at_half, scores = model.evaluate(df), model.predict(df)["income_probabilities"].to_numpy()
    threshold = float(np.median(scores[scores >= 0.5]))  # half of the rows predicted true at 0.5
    model.outputs = [model.outputs[0].model_copy(update={"threshold": threshold})]
    predicted = model.predict(df)
    probabilities, labels = predicted["income_probabilities"].to_numpy(), predicted["income_predictions"].to_numpy(dtype=bool)
    assert (labels == (probabilities >= threshold)).all() and 0 < labels.sum() < (probabilities >= 0.5).sum()
    strict = model.evaluate(df)
    assert strict["accuracy"] == pytest.approx((labels == df["income"].to_numpy()).mean())
    assert strict["accuracy"] != at_half["accuracy"] and strict["roc_auc"] == pytest.approx(at_half["roc_auc"])
    from types import SimpleNamespace

    from raylight.declarative.outputs import sets

    logits = torch.tensor([[0.0, 2.0]])  # a set output's labels at probabilities 0.5 and 0.88
    at = [sets.predictions(SimpleNamespace(threshold=t), logits)[0].tolist() for t in (0.5, 0.9)]
    assert at == [[[1, 1]], [[0, 0]]]
    saved = load_config(cfg, ["output_features.0.threshold=0.9"])
    assert saved.output_features[0].threshold == 0.9
    with pytest.raises(ConfigError, match="threshold: a binary or set or anomaly output's setting; a number output has none"):
        load_config(cfg, ["output_features.0.type=number", "output_features.0.threshold=0.9"])


def test_evaluate_training_set_reports_the_training_split_s_metrics_each_epoch(tmp_path):
    """Random labels: a wide model learns the training rows by heart and the validation rows
    stay at chance, so train_accuracy measures the training split (as Ludwig's
    evaluate_training_set does) and not the validation one. Off (the default), only the loss."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({f"x{i}": rng.normal(size=300) for i in range(8)})
    df["y"] = rng.integers(0, 2, 300).astype(bool)
    inputs = "".join(f"  - {{name: x{i}, type: number}}\n" for i in range(8))
    config = (
        f"input_features:\n{inputs}output_features:\n  - {{name: y, type: binary}}\n"
        "combiner: {type: concat, fc_layers: [{output_size: 128}, {output_size: 128}]}\n"
        "trainer: {epochs: 40, batch_size: 16, learning_rate: 0.01, early_stop: -1, evaluate_training_set: true}\n"
        "preprocessing: {split: {type: random, probabilities: [0.6, 0.4, 0.0]}}\nbackend: {type: local}\n"
    )
    for on in (True, False):
        run = tmp_path / str(on)
        run.mkdir()
        cfg, data = write(run, df=df, config=config if on else config.replace(", evaluate_training_set: true", ""))
        api.train(load_config(cfg), data, output_directory=str(run / "out"), progress=False)
        rows = [json.loads(line) for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
        measured = {k for k in rows[-1] if k.startswith("train_")}
        if not on:
            assert measured == {"train_loss"}, measured
            continue
        validation = {k.removeprefix("validation_") for k in rows[-1] if k.startswith("validation_")} - {"loss"}
        assert measured == {"train_loss"} | {f"train_{k}" for k in validation} and "train_roc_auc" in measured
        assert rows[-1]["train_accuracy"] >= 0.9 and rows[-1]["validation_accuracy"] <= 0.65, rows[-1]
        assert rows[0]["train_accuracy"] < rows[-1]["train_accuracy"]


# -- fault tolerance of declarative runs: backend.trainer.max_failures, --resume ---------
def test_backend_trainer_max_failures_defaults_to_restarts_and_is_checked(tmp_path):
    cfg, _ = write(tmp_path)
    assert load_config(cfg).backend.trainer.max_failures == 3  # a lost worker costs an epoch, not the run
    assert load_config(cfg, ["backend.trainer.max_failures=0"]).backend.trainer.max_failures == 0
    for bad in ("-1", "2.5", "'3'", "true"):
        with pytest.raises(ConfigError) as err:
            load_config(cfg, [f"backend.trainer.max_failures={bad}"])
        assert "backend.trainer.max_failures: must be a whole number >= 0" in str(err.value), str(err.value)


def _unfinished_run(path) -> None:
    """A run directory as a killed driver leaves it: two checkpoints, no model."""
    from raylight.driver.recorder import RunRecorder
    from raylight.storage.checkpoint import serialize_state
    from raylight.storage.run_dir import RunStorage
    from raylight.worker.protocol import Report

    rec = RunRecorder(RunStorage(str(path)), checkpoints_to_keep=2)
    rec.open({}, resume=False)
    rec.begin()
    for epoch in range(2):
        rec.record(Report({"epoch": epoch}, serialize_state({"epoch": epoch}), seq=epoch), num_workers=1)
    rec.lease.release()


def test_an_existing_output_directory_needs_resume_and_resume_needs_an_unfinished_run(tmp_path):
    run = tmp_path / "run"
    _unfinished_run(run)
    with pytest.raises(ConfigError) as err:
        api.new_output_dir(str(run))
    assert "holds a run that did not finish (last checkpoint: 1); pass --resume to continue it" in str(err.value)
    assert "or choose another --output-directory" in str(err.value)
    assert api.new_output_dir(str(run), resume=True) == str(run)
    with pytest.raises(ConfigError, match="holds no run to continue; drop --resume"):
        api.new_output_dir(str(tmp_path / "nothing"), resume=True)
    (run / "model").mkdir()
    with pytest.raises(ConfigError, match=r"holds a finished run .* nothing to continue"):
        api.new_output_dir(str(run), resume=True)
    with pytest.raises(ConfigError, match="already exists and is not empty; choose another --output-directory"):
        api.new_output_dir(str(run))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not a run directory"):
        api.new_output_dir(str(other), resume=True)
    cfg, data = write(tmp_path)
    res = run_cli("train", "--config", cfg, "--dataset", data, "--output-directory", str(tmp_path / "none"), "--resume")
    assert res.returncode == 2 and "holds no run to continue" in res.stderr, res.stderr
    assert not (tmp_path / "none").exists()
