"""Where preprocessing runs (the in-memory rule), Ludwig's config keys, and the pure pieces
of the Ray Data path (split quotas, block counts, combined moments). No Ray."""

import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import BaseModel

from raylight.base.exceptions import ConfigError
from raylight.config.validation import validate
from raylight.declarative import processor
from raylight.declarative.config.backend import ProcessorConfig
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.features import FEATURES
from raylight.declarative.layers import FCLayer
from raylight.declarative.ludwig.keys import (
    ANY,
    CLASSIFIER_ONLY,
    FC_LAYER_KEYS,
    FEATURE_KEYS,
    LUDWIG_KEYS,
    LUDWIG_VALUES,
)
from raylight.declarative.outputs import OUTPUTS
from raylight.declarative.preprocess import split_rows

MB = 1024**2
BASE = {"input_features": [{"name": "a", "type": "number"}], "output_features": [{"name": "b", "type": "binary"}]}


def config(**backend):
    return validate(ModelConfig, {**BASE, "backend": backend})


@pytest.mark.parametrize(
    ("settings", "backend", "estimated_mb", "expected"),
    [
        ({}, "ray", 10, "pandas"),  # auto, under the limit
        ({}, "ray", 100, "pandas"),  # at the limit: still in memory
        ({}, "ray", 101, "ray_data"),
        ({"type": "pandas"}, "ray", 10_000, "pandas"),  # the override wins both ways
        ({"type": "ray_data"}, "ray", 1, "ray_data"),
        ({"type": "dask"}, "ray", 1, "ray_data"),  # Ludwig's name runs on Ray Data
        ({"type": "ray_data"}, "local", 10_000, "pandas"),  # the local backend has no Ray
        ({}, "local", 10_000, "pandas"),
    ],
)
def test_the_rule_picks_pandas_for_data_that_fits_and_ray_data_beyond(settings, backend, estimated_mb, expected):
    choice = processor.choose(ProcessorConfig(**settings), backend, estimated_mb * MB, 100 * MB)
    assert choice.processor == expected
    assert choice.reason  # said in the log


def test_the_limit_is_a_setting_or_a_quarter_of_the_available_memory():
    assert processor.memory_limit(512, available=10**12) == 512 * MB
    assert processor.memory_limit("auto", available=8 * 1024 * MB) == 2 * 1024 * MB
    assert processor.memory_limit(0, available=10**12) == 0  # 0: always Ray Data under auto


def test_estimated_memory_is_the_files_size_times_the_formats_factor(tmp_path):
    frame = pd.DataFrame({"a": np.arange(1000.0), "b": ["x"] * 1000})
    frame.iloc[:500].to_csv(tmp_path / "p1.csv", index=False)
    frame.iloc[500:].to_csv(tmp_path / "p2.csv", index=False)
    size = (tmp_path / "p1.csv").stat().st_size + (tmp_path / "p2.csv").stat().st_size
    assert processor.estimated_memory(str(tmp_path / "*.csv")) == int(size * processor.IN_MEMORY_FACTOR["csv"])
    frame.to_parquet(tmp_path / "f.parquet")
    assert processor.estimated_memory(str(tmp_path / "f.parquet")) == int(
        (tmp_path / "f.parquet").stat().st_size * processor.IN_MEMORY_FACTOR["parquet"]
    )


def test_processor_settings_are_validated_with_their_key_path():
    assert config().backend.processor.type == "auto" and config().backend.processor.in_memory_limit_mb == "auto"
    assert config(processor={"in_memory_limit_mb": 64}).backend.processor.in_memory_limit_mb == 64
    with pytest.raises(ConfigError) as err:
        config(processor={"in_memory_limit_mb": -1})
    assert "backend.processor.in_memory_limit_mb" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config(processor={"type": "arrow"})
    assert "backend.processor.type" in str(err.value) and "'auto', 'pandas', 'ray_data' or 'dask'" in str(err.value)


def test_a_ludwig_distributed_backend_section_loads():
    cfg = config(
        type="ray",
        processor={"type": "dask"},
        trainer={"use_gpu": False, "num_workers": 2, "resources_per_worker": {"CPU": 0.5}, "strategy": "ddp"},
        cache_dir="/tmp/cache",
    )
    t = cfg.backend.trainer
    assert cfg.backend.processor.type == "dask" and t.num_workers == 2 and t.resources_per_worker == {"CPU": 0.5}


@pytest.mark.parametrize("path", sorted(k for k, (_, neutral) in LUDWIG_KEYS.items() if ANY not in neutral))
def test_each_ludwig_key_raylight_lacks_is_an_error_naming_its_path_and_the_fix(path):
    data = {**BASE, "backend": {}, "trainer": {}, "combiner": {}}
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = 7  # no key's neutral value
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, data)
    line = next(ln for ln in str(err.value).splitlines() if ln.strip().startswith(f"{path}:"))
    assert "Ludwig's setting, not raylight's" in line and (" use " in line or "remove" in line)


def test_ludwig_s_defaults_spelled_out_load_as_what_raylight_does():
    """A Ludwig config that writes out Ludwig's defaults for keys raylight lacks (``ludwig
    render_config`` does) loads: those values are what raylight does anyway. Other values
    of the same keys are still errors, and 0 is not False."""
    trainer = {
        "use_mixed_precision": False, "evaluate_training_set": False, "steps_per_checkpoint": 0,
        "checkpoints_per_epoch": 0, "train_steps": None, "eval_batch_size": None,
        "gradient_accumulation_steps": "auto", "effective_batch_size": "auto", "regularization_lambda": 0.0,
        "regularization_type": "l2", "max_batch_size": 1099511627776, "epochs": 3,
        "should_shuffle": True, "compile": False, "profiler": {}, "increase_batch_size_on_plateau": 0,
        "loss_balancing": "none", "model_soup": None, "modality_dropout": 0.0, "learning_rate_scaling": "linear",
        "validation_field": None, "validation_metric": None,
    }
    data = {**BASE, "model_type": "ecd", "ludwig_version": "0.17.8", "trainer": trainer}
    cfg = validate(ModelConfig, data)
    assert cfg.trainer.epochs == 3 and "model_type" in data  # the caller's dict is left as it was
    assert (cfg.trainer.validation_metric, cfg.trainer.validation_field) == ("loss", "combined")  # null: the default
    mixed = {**data, "trainer": {**trainer, "use_mixed_precision": True}}
    assert validate(ModelConfig, mixed).trainer.use_mixed_precision  # CPU workers: full precision, as Ludwig's
    with pytest.raises(ConfigError, match=r"trainer\.use_mixed_precision: mixed precision on GPUs is not available"):
        validate(ModelConfig, {**mixed, "backend": {"trainer": {"use_gpu": True}}})
    for given, taken in ((None, None), (0, None), ("auto", None), (256, 256)):  # Ludwig's eval_batch_size
        assert validate(ModelConfig, {**data, "trainer": {**trainer, "eval_batch_size": given}}).trainer.eval_batch_size == taken
    with pytest.raises(ConfigError, match=r"trainer\.eval_batch_size"):
        validate(ModelConfig, {**data, "trainer": {**trainer, "eval_batch_size": -1}})
    for key, value in (("compile", 0), ("gradient_accumulation_steps", 4), ("should_shuffle", False),
                       ("learning_rate_scaling", "sqrt")):
        with pytest.raises(ConfigError) as err:
            validate(ModelConfig, {**data, "trainer": {**trainer, key: value}})
        assert f"trainer.{key}: Ludwig's setting" in str(err.value)
    with pytest.raises(ConfigError, match="model_type: Ludwig's setting, not raylight's: raylight trains Ludwig's ecd"):
        validate(ModelConfig, {**data, "model_type": "llm"})


def test_ludwig_s_feature_sections_load_where_they_are_raylight_s_and_name_the_rest():
    """Ludwig's encoders, losses and decoders of the kinds raylight has (passthrough numbers
    and binaries, dense categories, a mean bag of text embeddings; its default loss and
    decoder per output type) load; any other value names the key inside the feature."""
    ludwig = {
        "input_features": [
            {"name": "a", "type": "number", "encoder": {"type": "passthrough"}},
            {"name": "b", "type": "binary", "encoder": {"type": "passthrough"}},
            {"name": "c", "type": "category", "encoder": {"type": "dense", "embedding_size": 8, "embeddings_trainable": True}},
            {"name": "d", "type": "text", "encoder": {"type": "embed", "reduce_output": "mean"}, "tied": None},
        ],
        "output_features": [{
            "name": "y", "type": "category", "top_k": 3, "reduce_input": "sum", "dependencies": [],
            "loss": {"type": "softmax_cross_entropy", "class_weights": None, "weight": 1.0, "robust_lambda": 0},
            "decoder": {"type": "classifier", "num_fc_layers": 0},
        }],
    }
    cfg = validate(ModelConfig, ludwig)
    assert cfg.input_features[2].encoder.embedding_size == 8 and cfg.output_features[0].type == "category"
    # each feature's preprocessing section as Ludwig 0.17's render_config writes it out
    rendered = {
        "number": {
            "missing_value_strategy": "fill_with_const", "fill_value": 0.0, "computed_fill_value": 0.0,
            "normalization": None, "outlier_strategy": None, "outlier_threshold": 3.0, "computed_outlier_fill_value": 0.0,
        },
        "binary": {"missing_value_strategy": "fill_with_false", "fallback_true_label": None, "fill_value": None, "computed_fill_value": None},
        "category": {
            "missing_value_strategy": "fill_with_const", "fill_value": "<UNK>", "computed_fill_value": "<UNK>",
            "lowercase": False, "most_common": 10000, "cache_encoder_embeddings": False,
        },
        "text": {
            "pretrained_model_name_or_path": None, "tokenizer": "space_punct", "vocab_file": None, "sequence_length": None,
            "max_sequence_length": 256, "most_common": 20000, "padding_symbol": "<PAD>", "unknown_symbol": "<UNK>",
            "padding": "right", "lowercase": False, "missing_value_strategy": "fill_with_const", "fill_value": "<UNK>",
            "computed_fill_value": "<UNK>", "ngram_size": 2, "cache_encoder_embeddings": False, "compute_idf": False,
        },
    }
    target = {"missing_value_strategy": "drop_row", "fill_value": "<UNK>", "computed_fill_value": "<UNK>", "lowercase": False, "most_common": 10000}
    data = {
        "input_features": [{**f, "preprocessing": rendered[f["type"]]} for f in ludwig["input_features"]],
        "output_features": [{**ludwig["output_features"][0], "preprocessing": target}],
    }
    cfg = validate(ModelConfig, data)
    number, _, category, text = cfg.input_features
    assert number.preprocessing.normalization == "none" and number.preprocessing.missing_value_strategy == "fill_with_const"
    assert text.preprocessing.tokenizer == "space_punct" and text.preprocessing.max_sequence_length == 256
    assert category.preprocessing.fill_value == "<UNK>" and not text.preprocessing.lowercase
    with pytest.raises(ConfigError, match=r"output_features\.0\.preprocessing\.missing_value_strategy: Ludwig's setting.*drop"):
        validate(ModelConfig, {**data, "output_features": [{**data["output_features"][0], "preprocessing": {"missing_value_strategy": "fill_with_const"}}]})
    # Ludwig's embed encoder sums unless told otherwise; raylight's default (no type) averages
    summed = {**ludwig, "input_features": [{"name": "d", "type": "text", "encoder": {"type": "embed"}}]}
    assert validate(ModelConfig, summed).input_features[0].encoder.reduce_output == "sum"
    plain = {**ludwig, "input_features": [{"name": "d", "type": "text", "encoder": {"embedding_size": 8}}]}
    assert validate(ModelConfig, plain).input_features[0].encoder.reduce_output == "mean"


@pytest.mark.parametrize(
    ("side", "kind", "path"),
    [(side, kind, path) for (side, kind), rules in FEATURE_KEYS.items() for path, (_, neutral) in rules.items() if ANY not in neutral],
)
def test_each_ludwig_feature_key_raylight_lacks_names_its_path_and_the_fix(side, kind, path):
    kinds = set(FEATURES) if side == "input" else set(OUTPUTS)
    feature = {"name": "f", "type": "number" if kind == "*" else kind}
    node = feature
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = "not-a-neutral-value"
    assert feature["type"] in kinds
    data = {**BASE, f"{side}_features": [feature]}
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, data)
    line = next(ln for ln in str(err.value).splitlines() if ln.strip().startswith(f"{side}_features.0.{path}:"))
    assert "Ludwig's setting, not raylight's" in line and (" use " in line or "remove" in line or "write" in line)


LUDWIG_RENDERED = sorted((Path(__file__).parent.parent / "data" / "ludwig").glob("*.yaml"))


@pytest.mark.parametrize("path", LUDWIG_RENDERED, ids=lambda p: p.stem)
def test_configs_as_ludwig_s_render_config_writes_them_load(path):
    """Ludwig 0.17.10's render_config output (every key, Ludwig's defaults included: the
    defaults section for every type, each feature's active, proc_column, encoder skip and
    adapter, decoder fc settings, the profiler, ...) loads, with the settings it names."""
    from raylight.declarative.loading import load_config

    cfg = load_config(str(path))
    source = yaml.safe_load(path.read_text())
    assert [f.name for f in cfg.input_features] == [f["name"] for f in source["input_features"]]
    assert cfg.trainer.epochs == source["trainer"]["epochs"] and cfg.preprocessing.split.type == source["preprocessing"]["split"]["type"]
    assert [fc.output_size for fc in cfg.combiner.fc_layers] == (
        [layer["output_size"] for layer in source["combiner"]["fc_layers"]] if source["combiner"]["fc_layers"]
        else [source["combiner"]["output_size"]] * source["combiner"]["num_fc_layers"]
    )
    if source.get("hyperopt"):  # Ludwig's variant_generator is raylight's random search; the rest as written
        h, written = cfg.hyperopt, source["hyperopt"]
        assert h is not None and h.search_alg.type == "random" and set(h.parameters) == set(written["parameters"])
        assert (h.metric, h.goal, h.executor.num_samples) == (written["metric"], written["goal"], written["executor"]["num_samples"])
        assert h.executor.scheduler.reduction_factor == written["executor"]["scheduler"]["reduction_factor"]


def test_ludwig_s_defaults_section_applies_to_each_feature_of_its_type():
    """Ludwig's ``defaults``: a type's preprocessing and encoder reach its input features
    (decoder and loss its outputs) where the feature does not set them; a section naming
    another type is the feature's own."""
    data = {
        "input_features": [
            {"name": "a", "type": "category"},
            {"name": "b", "type": "category", "encoder": {"embedding_size": 4}},
            {"name": "t", "type": "text", "encoder": {"type": "embed", "reduce_output": "mean"}},
            {"name": "n", "type": "number"},
        ],
        "output_features": [{"name": "y", "type": "binary"}],
        "defaults": {
            "category": {"encoder": {"type": "dense", "embedding_size": 16}, "preprocessing": {"most_common": 7}},
            "text": {"encoder": {"type": "parallel_cnn", "num_filters": 8}},  # not the feature's type: not merged
            "number": {"preprocessing": {"normalization": "minmax"}},
            "binary": {"loss": {"type": "binary_weighted_cross_entropy"}, "preprocessing": {"fallback_true_label": "x"}},
        },
    }
    a, b, t, n = validate(ModelConfig, data).input_features
    assert (a.encoder.embedding_size, a.preprocessing.most_common) == (16, 7)
    assert (b.encoder.embedding_size, b.preprocessing.most_common) == (4, 7)
    assert n.preprocessing.normalization == "minmax" and t.encoder.embedding_size == 32
    with pytest.raises(ConfigError, match=r"defaults: Ludwig's defaults: a mapping of feature type"):
        validate(ModelConfig, {**data, "defaults": {"category": 3}})
    # a refused key taken from defaults is named where it was written, once for both features
    summed = {**data, "defaults": {"category": {"encoder": {"type": "passthrough"}}}}
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, summed)
    lines = [ln.strip() for ln in str(err.value).splitlines() if "Ludwig's setting" in ln]
    assert len(lines) == 1 and lines[0].startswith("defaults.category.encoder.type: Ludwig's setting"), lines
    assert "use dense" in lines[0]
    with pytest.raises(ConfigError, match=r"input_features\.1\.encoder\.type: Ludwig's setting"):  # the feature's own
        validate(ModelConfig, {**summed, "input_features": [data["input_features"][0], {"name": "b", "type": "category", "encoder": {"type": "passthrough"}}]})


def test_ludwig_processors_raylight_does_not_run_name_the_ones_it_does():
    with pytest.raises(ConfigError) as err:
        config(processor={"type": "modin"})
    assert "backend.processor.type: Ludwig's modin processor is not available: use auto, pandas" in str(err.value)


@pytest.mark.parametrize(("path", "value"), sorted(LUDWIG_VALUES))
def test_each_ludwig_value_raylight_lacks_names_its_path_and_the_fix(path, value):
    data = {**BASE}
    section, _, key = path.rpartition(".")
    node = data
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[key] = value
    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, data)
    line = next(ln for ln in str(err.value).splitlines() if ln.strip().startswith(f"{path}:"))
    assert f"Ludwig's {value} " in line and " use " in line


def _raylight_key(model, path):
    """Whether ``path`` (dots between sections) is a key of pydantic ``model``'s sections."""
    head, _, rest = path.partition(".")
    if head not in model.model_fields:
        return False
    if not rest:
        return True
    annotation = model.model_fields[head].annotation
    sections = [a for a in (annotation, *typing.get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
    return any(_raylight_key(section, rest) for section in sections)


def test_no_ludwig_key_is_one_raylight_has():
    """A Ludwig key is checked (dropped or refused) before raylight's models read the
    config: one that raylight's models have too would never be read (except a classifier's
    decoder settings on other outputs, whose shared decoder section would ignore them)."""
    assert not [p for p in LUDWIG_KEYS if _raylight_key(ModelConfig, p)]
    for (side, kind), rules in FEATURE_KEYS.items():
        kinds = (["number", "binary", "category", "text"] if side == "input" else list(OUTPUTS)) if kind == "*" else [kind]
        for k in kinds:
            model = FEATURES[k].Input if side == "input" else OUTPUTS[k].Output
            # the decoder settings only a classifier reads: refused on the other outputs on purpose
            shared = set(CLASSIFIER_ONLY) if side == "output" and k not in ("binary", "category") else set()
            assert not [p for p in rules if _raylight_key(model, p) and p not in shared], (side, k)
    assert not [p for p in FC_LAYER_KEYS if _raylight_key(FCLayer, p)]
    assert _raylight_key(ModelConfig, "trainer.learning_rate_scheduler.decay")  # the check can fail
    assert _raylight_key(FEATURES["text"].Input, "preprocessing.tokenizer")


def test_ludwig_s_concat_combiner_spelling_is_written_as_raylight_s_layers():
    """Ludwig's ``num_fc_layers`` x ``output_size`` (its defaults 0 and 256), or
    ``fc_layers`` entries without a size, load as raylight's ``fc_layers``; Ludwig's
    rendered combiner (initialisers, norm_params, ... at their defaults) loads."""
    def layers(combiner):
        return [fc.output_size for fc in validate(ModelConfig, {**BASE, "combiner": combiner}).combiner.fc_layers]

    assert layers({"type": "concat", "output_size": 64, "num_fc_layers": 2}) == [64, 64]
    assert layers({"num_fc_layers": 3}) == [256, 256, 256]
    assert layers({"num_fc_layers": 0, "output_size": 256, "fc_layers": None}) == []
    assert layers({"output_size": 8, "fc_layers": [{}, {"output_size": 4}]}) == [8, 4]
    assert layers({"num_fc_layers": 5, "fc_layers": [{"output_size": 4}]}) == [4]  # Ludwig: fc_layers wins
    assert layers({}) == [64]  # raylight's default is one layer; Ludwig's none
    rendered = {
        "type": "concat", "dropout": 0.0, "activation": "relu", "flatten_inputs": False, "residual": False,
        "use_bias": True, "bias_initializer": "zeros", "weights_initializer": "xavier_uniform", "num_fc_layers": 1,
        "output_size": 32, "norm": None, "norm_params": None, "fc_layers": None, "batch_ensemble": False,
        "num_ensemble_members": 4,
    }
    assert layers(rendered) == [32]
    ludwig_layer = {"output_size": 8, "weights_initializer": "xavier_uniform", "bias_initializer": "zeros", "norm_params": None}
    assert layers({"fc_layers": [ludwig_layer, {"output_size": 4}]}) == [8, 4]
    with pytest.raises(ConfigError, match=r"combiner\.fc_layers\.1\.bias_initializer: Ludwig's setting"):
        layers({"fc_layers": [ludwig_layer, {**ludwig_layer, "bias_initializer": "ones"}]})
    with pytest.raises(ConfigError, match=r"num_fc_layers \(Ludwig's\) must be a whole number from 0 to 64, got -1"):
        layers({"num_fc_layers": -1})
    with pytest.raises(ConfigError, match=r"combiner\.weights_initializer: Ludwig's setting"):
        layers({**rendered, "weights_initializer": "normal"})


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_quotas_fill_every_block_and_match_the_pandas_split_sizes(seed):
    from raylight.declarative.ray_data import split_quotas

    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 500, size=int(rng.integers(1, 12)))
    blocks[0] += 1  # at least one row
    probs = (0.7, 0.1, 0.2)
    quotas = split_quotas(blocks, probs, seed)
    assert quotas.shape == (len(blocks), 3) and (quotas >= 0).all()
    assert (quotas.sum(axis=1) == blocks).all()
    train, val, test = split_rows(int(blocks.sum()), probs, seed)
    assert quotas.sum(axis=0).tolist() == [len(train), len(val), len(test)]
    assert (split_quotas(blocks, probs, seed) == quotas).all()  # seeded


def test_output_blocks_use_the_cpus_but_stay_large():
    from raylight.declarative.ray_data import MIN_BLOCK_ROWS, output_blocks

    assert output_blocks(1, 500, 16) == 1  # small data: one block, one task per pass
    assert output_blocks(1, 10 * MIN_BLOCK_ROWS, 4) == 4
    assert output_blocks(1, 10 * MIN_BLOCK_ROWS, 64) == 10
    assert output_blocks(30, 10 * MIN_BLOCK_ROWS, 4) == 30  # never fewer than were read


@pytest.mark.parametrize("seed", range(5))
def test_combined_block_moments_equal_numpy_over_all_values(seed):
    from raylight.declarative.features.number import combine_moments

    rng = np.random.default_rng(seed)
    values = rng.normal(1e6, 3.0, size=1000)  # a large mean: sums of squares would lose the variance
    cuts = np.sort(rng.choice(np.arange(1, 1000), size=6, replace=False))
    rows = []
    for part in [*np.split(values, cuts), np.array([])]:
        n = len(part)
        mean = float(part.mean()) if n else 0.0
        rows.append({"n": n, "mean": mean, "m2": float(((part - mean) ** 2).sum()), "min": part.min() if n else np.inf, "max": part.max() if n else -np.inf})
    n, mean, m2, low, high = combine_moments(pd.DataFrame(rows))
    assert n == 1000 and low == values.min() and high == values.max()
    assert mean == pytest.approx(values.mean(), rel=1e-12)
    assert np.sqrt(m2 / n) == pytest.approx(values.std(), rel=1e-9)


def test_parquet_goes_through_ray_datas_first_reader_only_inside_raylights_read(monkeypatch):
    """Ray Data's reader switch is process-wide: raylight turns its default reader off for
    its own read only (restored after, and after an error), and an explicit
    RAY_DATA_USE_DATASOURCE_V2 stays the user's choice."""
    from ray.data import DataContext

    from raylight.declarative.ray_data import PARQUET_READER_ENV, _parquet_reader_v1

    context = DataContext.get_current()
    monkeypatch.delenv(PARQUET_READER_ENV, raising=False)
    monkeypatch.setattr(context, "use_datasource_v2", True)
    with _parquet_reader_v1():
        assert context.use_datasource_v2 is False
    assert context.use_datasource_v2 is True
    with pytest.raises(KeyError), _parquet_reader_v1():
        raise KeyError("a read that fails")
    assert context.use_datasource_v2 is True
    monkeypatch.setenv(PARQUET_READER_ENV, "1")
    with _parquet_reader_v1():
        assert context.use_datasource_v2 is True


def test_ray_data_reads_local_files_where_they_are():
    """A local path is on the driver's machine: on a cluster of several, the driver reads it
    and ships the blocks (tests/hosts/test_dataset_over_hosts.py runs it across hosts)."""
    from raylight.declarative.ray_data import read_here

    assert read_here("data/train.csv", alive_nodes=1, client=False) is False  # one machine: Ray Data reads
    assert read_here("data/train.csv", alive_nodes=3, client=False) is True
    with pytest.raises(ConfigError, match=r"dataset data/train.csv: .*cannot see this machine's files through Ray Client.*s3://.*processor: \{type: pandas\}"):
        read_here("data/train.csv", alive_nodes=3, client=True)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_the_driver_reads_a_local_file_a_block_at_a_time_with_every_row(tmp_path, fmt):
    import pandas as pd
    import pyarrow as pa

    from raylight.declarative.ray_data import _blocks
    from tests.declarative_data import frame

    df = frame(300).drop(columns=["age"])  # NaN ages: JSON writes them as null
    path = str(tmp_path / f"data.{fmt}")
    if fmt == "parquet":
        df.to_parquet(path, row_group_size=100)
    elif fmt == "csv":
        df.to_csv(path, index=False)
    else:
        df.to_json(path, orient="records", lines=True)
    blocks = list(_blocks([path], fmt))
    assert len(blocks) == (3 if fmt == "parquet" else 1), "a Parquet row group a block"
    got = pa.concat_tables(blocks).to_pandas()
    pd.testing.assert_frame_equal(got, df, check_dtype=False)


def test_a_local_file_the_driver_cannot_read_names_the_file(tmp_path):
    from raylight.declarative.ray_data import _blocks

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match=r"bad\.parquet.*cannot be read as parquet.*Parquet file"):
        list(_blocks([str(bad)], "parquet"))
