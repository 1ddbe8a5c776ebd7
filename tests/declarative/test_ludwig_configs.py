"""Ludwig configs as Ludwig users write them (tests/declarative/ludwig_configs/, from
Ludwig's examples, its test helpers and its docs; README.md there): each raylight supports
loads, each other is refused at once with every reason at its key path, and a few train
end to end on small generated data (the local backend, no Ray)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config, load_yaml

CONFIGS = Path(__file__).parent / "ludwig_configs"

# Each config's fate: None, it loads; else the key paths of its refusal, each with a word
# of the reason.
EXPECTED: dict[str, dict[str, str] | None] = {
    "class_imbalance_balanced": None,
    "class_imbalance_standard": None,
    "docs_defaults_concat": None,
    "helpers_category_output": None,
    "helpers_ray_backend": None,
    "hypernetwork_concat": None,
    "multi_task_no_balancing": None,
    "optimizers_adamw": None,
    "optimizers_radam": None,
    "rotten_tomatoes": None,
    "titanic_model1": None,
    "titanic_model2": None,
    "uncertainty_baseline": None,
    "docs_deepspeed_zero3": {"backend.trainer.strategy": "stage 3 is not available"},
    "forecasting": {  # timeseries output and input load; the sliding window over one column does not
        "input_features.0.preprocessing.window_size": "no sliding window",
        "output_features.0.preprocessing.horizon": "no sliding window",
        "input_features.0.encoder.type": "'parallel_cnn'",
    },
    "helpers_sequence": None,  # other encoder types' sizes on each encoder: ignored with a note, as Ludwig does
    # the image input (encoder: vit, Ludwig before 0.6): img_height / in_channels are its preprocessing's, the HF
    # ViT's sizes b_16's; what stays is its pre-trained weights, which would need a download
    "insurance_lite": {"input_features.0.encoder": "use_pretrained"},
    "lbfgs": None,  # torch's LBFGS through a closure; Ludwig's sparse (one-hot) category encoder
    "mnist": None,  # encoder: stacked_cnn (Ludwig before 0.6), conv layers in Ludwig's old names (num_filters, ...)
    "multi_task_famo": None,
    "optimizers_adafactor": None,  # torch.optim.Adafactor
    "ray_job_submission": None,
    "tabnet_higgs_small": None,  # bn_virtual_divider, weight_regularization: ignored, as Ludwig 0.17 drops them
    "uncertainty_mc_dropout": None,  # decoder mc_dropout_samples: Monte Carlo dropout at prediction
    # The configs of issue 56's second part: new combiners, image inputs, timeseries outputs.
    "docs_combiner_sequence_concat": None,
    "docs_multi_label_image": None,  # an image input, encoder named as Ludwig before 0.6 wrote it
    "open_set_baseline": None,
    "docs_combiner_comparator": None,  # Ludwig's docs: num_fc_layers 0 (the inputs compared)
    "docs_combiner_tabnet": {"combiner.ooutput_size": "did you mean 'output_size'?"},  # the docs' typo
    "docs_combiner_transformer": None,  # the docs' fc_residual: null, false as Ludwig reads it
    "tabnet_higgs_medium": None,
    "image_stacked_cnn": None,  # use_pretrained: false on an encoder without weights
    "image_dinov2_linear_probe": {"input_features.0.encoder.type": "use_pretrained: true cannot be satisfied offline"},
    "open_set_baseline_mnist": None,
    "open_set_objectosphere_mnist": None,  # category loss objectosphere, background_class an index of the classes
    "timeseries_nbeats": None,  # N-BEATS from scratch; the features' window_size (not Ludwig's key): ignored
    "timeseries_patchtst": None,  # PatchTST from scratch; window_size ignored, as Ludwig drops it
    "multi_task_nash_mtl": None,
    "multi_task_uncertainty": None,
    "uncertainty_calibrated": None,  # decoder calibration: temperature scaling fitted on the validation split
    "optimizers_muon": None,  # torch.optim.Muon on the 2-D weights, AdamW on the rest
    "optimizers_schedule_free_adamw": None,  # the schedulefree package
    "hypernetwork_hypernetwork": None,
    "hyperopt_optuna": None,  # executor.type optuna: search_alg optuna; its int space; metric validation.combined.loss
    "anomaly_deep_svdd": None,  # an anomaly output, Deep SVDD's soft boundary (nu 0.1)
}


def test_the_corpus_is_the_expected_one():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)
    for path in CONFIGS.glob("*.yaml"):
        assert path.read_text().startswith("# "), f"{path.name}: its first lines say where it comes from"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_config_loads_or_is_refused_with_every_reason_at_once(name):
    expected = EXPECTED[name]
    path = str(CONFIGS / f"{name}.yaml")
    if expected is None:
        config = load_config(path)
        assert [f.name for f in config.output_features] == [f["name"] for f in load_yaml(path)["output_features"]]
        return
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = {ln.strip().split(": ", 1)[0]: ln for ln in str(err.value).splitlines()[1:]}
    assert set(lines) == set(expected), str(err.value)
    for key, word in expected.items():
        assert word in lines[key], lines[key]


def _column(feature: dict, rows: int, rng: np.random.Generator) -> pd.Series:
    kind = feature["type"]
    if kind == "number":
        return pd.Series(rng.normal(size=rows))
    if kind == "binary":
        return pd.Series(rng.integers(0, 2, size=rows).astype(bool))
    if kind == "category":
        return pd.Series(rng.choice(["red", "green", "blue"], size=rows))
    if kind in ("set", "bag", "text"):
        words = np.array(["alpha", "beta", "gamma", "delta", "eps"])
        return pd.Series([" ".join(rng.choice(words, size=3)) for _ in range(rows)])
    raise AssertionError(f"no generator for {kind}")


def _dataset(path: Path, config_file: Path, rows: int = 240) -> str:
    """Rows for the config's columns; each target follows the first number input (a
    signal to learn)."""
    raw = load_yaml(str(config_file))
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({f.get("column", f["name"]): _column(f, rows, rng) for f in raw["input_features"]})
    signal = frame[next(f["name"] for f in raw["input_features"] if f["type"] == "number")]
    for out in raw["output_features"]:
        frame[out["name"]] = {
            "binary": signal > 0, "number": 2 * signal, "category": pd.cut(signal, [-np.inf, -0.5, 0.5, np.inf], labels=["lo", "mid", "hi"]).astype(str),
        }[out["type"]]
    frame.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize(("name", "overrides", "metric", "least"), [
    ("titanic_model2", [], "accuracy", 0.75),  # an output's fc_layers (Ludwig before 0.6): decoder layers
    # set and bag inputs, decoder layers, optimizer.lr; concat: Ludwig's default for its three inputs,
    # ft_transformer, stays at 0.5 on these 240 rows in 20 epochs (measured 2026-12-06)
    ("helpers_category_output", ["combiner.type=concat"], "accuracy", 0.6),
    ("optimizers_radam", ["trainer.optimizer.lr=0.01"], "accuracy", 0.75),  # radam; learning_rate_scheduler.type ignored
    ("optimizers_muon", ["trainer.optimizer.lr=0.01"], "accuracy", 0.75),  # Muon on the 2-D weights, AdamW the rest
    ("optimizers_schedule_free_adamw", ["trainer.optimizer.lr=0.01"], "accuracy", 0.75),  # evaluated at its average
    ("multi_task_uncertainty", [], "quality_binary/accuracy", 0.75),  # loss_balancing: Kendall et al.'s
    ("multi_task_nash_mtl", [], "quality_binary/accuracy", 0.75),  # loss_balancing: Nash-MTL's solve each step
])
def test_a_few_train_end_to_end_on_generated_data(tmp_path, name, overrides, metric, least):
    config_file = CONFIGS / f"{name}.yaml"
    config = load_config(str(config_file), ["trainer.epochs=20", "trainer.batch_size=32", "backend=null", *overrides])
    data = _dataset(tmp_path / "data.csv", config_file)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), backend="local", progress=False)
    test = out["evaluation"]["test"]
    target = config.output_features[0].name
    key = metric if metric in test else f"{target}/{metric}"
    assert test[key] >= least, test
