"""Set, bag and vector input features (Ludwig's types): their arrays, their encoders
against Ludwig's definitions (EmbedSet, EmbedWeighted, the dense encoder), bad values,
and models that learn what only each type can tell them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.features import bag, infer_type, sets, vector
from raylight.declarative.loading import load_config
from tests.declarative_data import write


def set_feature(kind="set", **preprocessing):
    model = sets.SetInput if kind == "set" else bag.BagInput
    return model(name="tags", type=kind, preprocessing=preprocessing)


def test_a_set_row_is_its_known_tokens_most_common_first():
    col = pd.Series(["red big", "big", "big red red", None, "", "blue red big green"])
    feat = set_feature()
    meta = sets.fit(col, feat)
    # in how many rows each occurs; ties by name; a missing row fills with <UNK>: no tokens
    assert meta == {"vocab": ["<UNK>", "big", "red", "blue", "green"], "width": 4}
    array, keep = sets.transform(col, feat, meta)
    assert keep is None and array.tolist() == [[1, 2, 0, 0], [1, 0, 0, 0], [1, 2, 0, 0], [0] * 4, [0] * 4, [1, 2, 3, 4]]
    # another split: unknown tokens add nothing, a row wider than any training row keeps its most common
    narrow = {**meta, "width": 2}
    assert sets.transform(pd.Series(["green pink blue big"]), feat, narrow)[0].tolist() == [[1, 3]]
    _, keep = sets.transform(col, set_feature(missing_value_strategy="drop_row"), meta)
    assert keep.tolist() == [True, True, True, False, False, True]
    filled, _ = sets.transform(col, set_feature(fill_value="blue"), meta)
    assert filled[3].tolist() == [3, 0, 0, 0]
    comma = set_feature(tokenizer="comma", lowercase=True)
    assert sets.fit(pd.Series(["Dark Red, blue", "blue"]), comma)["vocab"] == ["<UNK>", "blue", "dark red"]


def test_a_bag_row_is_its_known_tokens_and_their_counts():
    col = pd.Series(["a a b", "b c c c", "a"])
    feat = set_feature("bag")
    meta = bag.fit(col, feat)
    assert meta == {"vocab": ["<UNK>", "a", "c", "b"], "width": 2}  # counted over every occurrence; ties by name
    array, _ = bag.transform(col, feat, meta)
    assert array.dtype == np.float32
    assert array.tolist() == [[1, 3, 2, 1], [2, 3, 3, 1], [1, 0, 1, 0]]  # indices, then counts


@pytest.mark.parametrize("kind", ["set", "bag"])
def test_set_and_bag_encoders_sum_embeddings_as_ludwig_s_embed_set_and_embed_weighted(kind):
    col = pd.Series(["a a b", "b c c c", "z", "a"])
    feat = set_feature(kind)
    module_of = sets if kind == "set" else bag
    meta = module_of.fit(col, feat)
    module, width = module_of.encoder(feat, meta)
    assert width == min(50, len(meta["vocab"])) == 5  # Ludwig: at most the vocabulary's size
    table = module.embed.weight.detach()
    x, _ = module_of.transform(col, feat, meta)
    got = module(torch.as_tensor(x))
    # Ludwig's definitions over a multi-hot (set) or frequency (bag) row; index 0 masked out
    index = {t: i for i, t in enumerate(meta["vocab"])}
    for r, text in enumerate(col):
        weights = torch.zeros(len(index))
        for token in text.split():
            if token in index:
                weights[index[token]] = 1.0 if kind == "set" else weights[index[token]] + 1.0
        weights[0] = 0.0
        assert torch.allclose(got[r], weights @ table, atol=1e-6), (kind, text)
    forced = bag.BagInput(name="w", type="bag", encoder={"embedding_size": 8, "force_embedding_size": True})
    assert bag.encoder(forced, meta)[1] == 8
    layered = sets.SetInput(name="w", type="set", encoder={"num_fc_layers": 2, "output_size": 6, "dropout": 0.2})
    assert sets.encoder(layered, meta)[1] == 6


def vec(**kwargs):
    return vector.VectorInput(name="emb", type="vector", **kwargs)


def test_a_vector_column_reads_strings_and_lists_and_names_what_is_wrong():
    col = pd.Series(["1 2 3", [4.0, 5.0, 6.0], np.array([7, 8, 9]), None, " "])
    feat = vec()
    meta = vector.fit(col, feat)
    vector.check(col, feat, "input_features")
    array, keep = vector.transform(col, feat, meta)
    assert meta == {"size": 3} and keep is None
    assert array.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 0], [0, 0, 0]]
    filled, _ = vector.transform(col, vec(preprocessing={"fill_value": "0.5 0.5 1"}), meta)
    assert filled[3].tolist() == [0.5, 0.5, 1.0]
    _, keep = vector.transform(col, vec(preprocessing={"missing_value_strategy": "drop_row"}), meta)
    assert keep.tolist() == [True, True, True, False, False]
    with pytest.raises(ConfigError, match=r"column 'emb' \(input_features 'emb', type vector\) has vectors of \[2, 3\] numbers "
                       r"\(row 1 has 2\), but its rows must share one length"):
        vector.check(pd.Series(["1 2 3", "1 2"]), feat, "input_features")
    with pytest.raises(ConfigError, match=r"has vectors of \[3\] numbers .*but preprocessing.vector_size is 4"):
        vector.check(pd.Series(["1 2 3"]), vec(preprocessing={"vector_size": 4}), "input_features")
    with pytest.raises(ConfigError, match=r"not vectors of finite numbers, such as \['1 x 3', '1 inf 2'\] \(first at row 1\)"):
        vector.check(pd.Series(["1 2 3", "1 x 3", "1 inf 2"]), feat, "input_features")
    with pytest.raises(ConfigError, match=r"preprocessing\.fill_value '1 2' is not a vector of 3"):
        vector.transform(col, vec(preprocessing={"fill_value": "1 2"}), meta)
    with pytest.raises(ConfigError, match=r"\(row 0\); the model takes 3"):  # data to predict on
        vector.transform(pd.Series(["1 2 3 4"]), feat, meta)


def test_vector_encoders_are_ludwig_s_dense_and_passthrough():
    meta = {"size": 5}
    module, width = vector.encoder(vec(), meta)  # Ludwig's default: one layer of 256
    assert width == 256 and module(torch.zeros(3, 5)).shape == (3, 256)
    assert vector.encoder(vec(encoder={"num_layers": 2, "output_size": 7}), meta)[1] == 7
    assert len(vec(encoder={"num_layers": 2, "output_size": 7}).encoder.fc_layers) == 2
    module, width = vector.encoder(vec(encoder={"type": "passthrough"}), meta)
    assert width == 5 and isinstance(module, torch.nn.Identity)
    with pytest.raises(ValueError, match="a passthrough encoder has no layers"):
        vec(encoder={"type": "passthrough", "fc_layers": [{"output_size": 3}]})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (pd.Series(["0.1 0.5 0.2 0.9", "1 2 3 4", "-1 0 1e3 2"]), "vector"),  # not text
        (pd.Series(["0.1 0.5", "1 2 3", "4 5 6 7 8"]), "text"),  # lengths differ
        (pd.Series(["a b c d e", "v w x y z", "q r s t u"]), "text"),
    ],
)
def test_init_config_gives_vector_columns_the_vector_type(values, expected):
    assert infer_type(values) == expected


CONFIG = """\
input_features:
  - {name: f, type: %s}
output_features:
  - {name: y, type: binary}
trainer: {epochs: 30, batch_size: 32, learning_rate: 0.01}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


@pytest.mark.parametrize("kind", ["set", "bag", "vector"])
def test_a_model_learns_what_only_its_input_type_tells(tmp_path, kind):
    """set: y is whether "red" is among the tags; bag: whether "a" occurs at least twice
    (a set of the same tokens cannot tell); vector: whether its first number is positive."""
    rng = np.random.default_rng(1)
    n = 600
    if kind == "set":
        values = [" ".join(rng.choice(["red", "blue", "green", "big", "small"], rng.integers(1, 4), replace=False)) for _ in range(n)]
        y = ["red" in v.split() for v in values]
    elif kind == "bag":
        values = [" ".join(rng.choice(["a", "b", "c"], rng.integers(1, 6))) for _ in range(n)]
        y = [v.split().count("a") >= 2 for v in values]
    else:
        rows = rng.normal(size=(n, 4))
        values, y = [" ".join(map(str, r)) for r in rows], list(rows[:, 0] > 0)
    cfg, data = write(tmp_path, df=pd.DataFrame({"f": values, "y": y}), config=CONFIG % kind)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] >= 0.95, out["evaluation"]
    if kind == "bag":  # the same rows as a set: the counts are lost, and with them the target
        (tmp_path / "as_set").mkdir()
        cfg, data = write(tmp_path / "as_set", df=pd.DataFrame({"f": values, "y": y}), config=CONFIG % "set")
        as_set = api.train(load_config(cfg), data, output_directory=str(tmp_path / "set"), progress=False)
        assert as_set["evaluation"]["test"]["accuracy"] < out["evaluation"]["test"]["accuracy"] - 0.05


def test_ludwig_s_rendered_set_bag_and_vector_config_trains_as_written(tmp_path):
    """tests/data/ludwig/set_bag_vector.yaml, as Ludwig 0.17.10 wrote it: Ludwig's
    defaults (set and bag embeddings of at most 50, no layers; the vector's one dense layer
    of 256) and a missing value of each type, filled."""
    from pathlib import Path

    from raylight.declarative.train import load_model

    rendered = Path(__file__).parent.parent / "data" / "ludwig" / "set_bag_vector.yaml"
    config = load_config(str(rendered), ["trainer.epochs=1"])
    rng = np.random.default_rng(0)
    df = pd.DataFrame({
        "tags": [" ".join(rng.choice(["p", "q", "r"], 2, replace=False)) for _ in range(120)],
        "words": [" ".join(rng.choice(["a", "b"], 3)) for _ in range(120)],
        "emb": [" ".join(map(str, rng.normal(size=3))) for _ in range(120)],
        "x": rng.normal(size=120), "y": rng.integers(0, 2, 120).astype(bool),
    })
    df.loc[3, ["tags", "words", "emb"]] = None
    _, data = write(tmp_path, df=df)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    model = load_model(out["model_path"]).model
    assert [model.embeddings[n].width for n in ("tags", "words", "emb")] == [4, 3, 256]  # vocabularies of 4 and 3 (<UNK> too)


def test_a_set_target_is_multi_label_classification_measured_by_jaccard(tmp_path):
    """An output of type set (Ludwig's): labels separated by spaces, one sigmoid each,
    predicted at 0.5; its metric, jaccard, is the mean over rows of |predicted & true| /
    |predicted | true|, as computed here from the model's predictions."""
    from raylight.declarative.train import load_model

    col = pd.Series(["warm wet", "wet", "wet windy", None, "", "cold"])
    meta = sets.fit_target(col.iloc[:5], None)
    assert meta == {"classes": ["wet", "warm", "windy"]}  # most rows first, ties by name; no rows: none
    target = sets.target_array(col, meta["classes"])
    assert target.tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]]  # "cold": unknown
    with pytest.raises(ConfigError, match=r"target column 'labels' \(set\) has no labels in the training split"):
        sets.fit_target(pd.Series(["", None]), type("Out", (), {"col": "labels"})())

    rng = np.random.default_rng(0)
    x = rng.normal(size=(700, 3))
    labels = [" ".join(n for n, on in (("warm", r[0] > 0), ("wet", r[1] > 0.3), ("windy", r[2] > -0.5)) if on) or "calm" for r in x]
    df = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "labels": labels})
    config = CONFIG.replace("  - {name: f, type: %s}\n", "  - {name: a, type: number}\n  - {name: b, type: number}\n  - {name: c, type: number}\ncombiner: {type: concat}\n")
    config = config.replace("{name: y, type: binary}", "{name: labels, type: set}").replace("learning_rate: 0.01}", "learning_rate: 0.01, validation_metric: jaccard}")
    cfg, data = write(tmp_path, df=df, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["jaccard"] >= 0.9, out["evaluation"]
    model = load_model(out["model_path"])
    predicted = model.predict(df)["labels_predictions"]
    assert set(model.predict(df.head(1)).columns) == {"labels_predictions", *(f"labels_probability_{c}" for c in model.meta["labels"]["classes"])}
    truth = [set(v.split()) for v in df["labels"]]
    by_hand = np.mean([len(set(p) & t) / len(set(p) | t) if set(p) | t else 1.0 for p, t in zip(predicted, truth, strict=True)])
    assert np.isclose(model.evaluate(df)["jaccard"], by_hand)
    # written out: a CSV cell holds the labels as a set is read (separated by spaces), JSON lines a list
    few = model.predict(df.head(5))
    api.write_frame(few, str(tmp_path / "p.csv"))
    api.write_frame(few, str(tmp_path / "p.jsonl"))
    as_csv = pd.read_csv(tmp_path / "p.csv", keep_default_na=False)["labels_predictions"].tolist()
    assert as_csv == [" ".join(v) for v in few["labels_predictions"]]
    assert pd.read_json(tmp_path / "p.jsonl", lines=True)["labels_predictions"].tolist() == few["labels_predictions"].tolist()


def test_ludwig_s_rendered_set_output_config_trains_as_written(tmp_path):
    from pathlib import Path

    rendered = Path(__file__).parent.parent / "data" / "ludwig" / "set_output.yaml"
    config = load_config(str(rendered), ["trainer.epochs=1"])
    assert config.output_features[0].type == "set" and config.trainer.validation_metric == "jaccard"
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(size=100), "t": ["good day"] * 50 + ["bad day"] * 50, "labels": ["p q", "q", "r"] * 33 + ["p"]})
    _, data = write(tmp_path, df=df)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    assert 0 <= out["evaluation"]["test"]["jaccard"] <= 1


def _vectors(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """Two numbers and a vector target of three floats computed from them."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    return pd.DataFrame({"a": a, "b": b, "v": [f"{x + y:.5f} {2 * x:.5f} {10 - y:.5f}" for x, y in zip(a, b, strict=True)]})


VECTOR_OUT = """\
input_features:
  - {name: a, type: number}
  - {name: b, type: number}
output_features:
  - {name: v, type: vector}
trainer: {epochs: 30, batch_size: 32, learning_rate: 0.01, validation_metric: mean_squared_error}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


def test_a_vector_target_is_regression_of_each_float_measured_as_ludwig_s(tmp_path):
    """An output of type vector (Ludwig's): each row's floats through a linear projector,
    trained on their mean squared error; mse and mae over every float and r2 the mean of
    the columns' r2 (torchmetrics' uniform average, Ludwig's), as computed here from the
    model's predictions; predictions are lists, written to CSV as a vector is read; a row
    without a vector is dropped from training."""
    from raylight.declarative.train import load_model

    df = _vectors()
    df.loc[[4, 9], "v"] = None
    cfg, data = write(tmp_path, df=df, config=VECTOR_OUT)
    prepared = api.prepare(load_config(cfg), data)
    assert prepared.meta["v"] == {"size": 3}
    assert sum(len(s["v"]) for s in (prepared.train, prepared.validation, prepared.test)) == 598
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["r2"] > 0.95, out["evaluation"]
    model = load_model(out["model_path"])
    fresh = _vectors(200, seed=3)
    predicted = np.array(model.predict(fresh)["v_predictions"].tolist())
    truth = np.array([[float(x) for x in v.split()] for v in fresh["v"]])
    err = predicted - truth
    r2 = np.mean(1 - (err**2).sum(0) / ((truth - truth.mean(0)) ** 2).sum(0))
    metrics = model.evaluate(fresh)
    assert metrics["mse"] == pytest.approx((err**2).mean(), rel=1e-4) and metrics["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-4)
    assert metrics["r2"] == pytest.approx(r2, rel=1e-4) and metrics["loss"] == pytest.approx(metrics["mse"], rel=1e-4)
    api.write_frame(model.predict(fresh.head(3)), str(tmp_path / "p.csv"))
    written = pd.read_csv(tmp_path / "p.csv")["v_predictions"]
    assert np.allclose([[float(x) for x in row.split()] for row in written], predicted[:3], rtol=1e-6)


def test_a_vector_target_s_length_is_checked_and_named():
    """Rows of another length than the others, or than vector_size, are errors naming the
    output's key; vector_size belongs to vector outputs."""
    from raylight.declarative.config.model import ModelConfig

    out = ModelConfig.model_validate({
        "input_features": [{"name": "a", "type": "number"}], "output_features": [{"name": "v", "type": "vector", "vector_size": 2}],
    }).output_features[0]
    with pytest.raises(ConfigError, match=r"output_features 'v', type vector\) has vectors of \[3\] numbers.*but vector_size is 2"):
        vector.check(pd.Series(["1 2 3", "4 5 6"]), out, "output_features")
    assert vector.fit(pd.Series(["1 2", None]), out) == {"size": 2}
    array, keep = vector.transform(pd.Series(["1 2", None, ""]), out, {"size": 2})
    assert array.tolist()[0] == [1.0, 2.0] and keep.tolist() == [True, False, False]
    with pytest.raises(Exception, match=r"output_features\.0\.vector_size\n  a vector output's setting; a number output has none"):
        ModelConfig.model_validate({
            "input_features": [{"name": "a", "type": "number"}], "output_features": [{"name": "v", "type": "number", "vector_size": 2}],
        })


def test_ludwig_s_rendered_vector_output_config_trains_as_written(tmp_path):
    from pathlib import Path

    rendered = Path(__file__).parent.parent / "data" / "ludwig" / "vector_output.yaml"
    config = load_config(str(rendered), ["trainer.epochs=3", "trainer.batch_size=32"])
    assert config.output_features[0].type == "vector" and config.trainer.validation_metric == "mse"
    _, data = write(tmp_path, df=_vectors(200))
    out = api.train(config, data, output_directory=str(tmp_path / "run"), backend="local", progress=False)
    assert set(out["evaluation"]["test"]) == {"loss", "mse", "mae", "r2"}


def test_a_timeseries_row_is_its_numbers_cut_and_padded_as_ludwig_s():
    from raylight.declarative.features import timeseries

    def ts(**preprocessing):
        return timeseries.TimeseriesInput(name="ts", type="timeseries", preprocessing=preprocessing)

    col = pd.Series(["1 2 3", [4.0, 5.0], None, "6"])
    meta = timeseries.fit(col, ts())
    assert meta == {"length": 3}  # the longest training row
    array, keep = timeseries.transform(col, ts(), meta)
    assert keep is None and array.tolist() == [[1, 2, 3], [4, 5, 0], [0, 0, 0], [6, 0, 0]]
    left, _ = timeseries.transform(col, ts(padding="left", padding_value=-1, fill_value="9 9"), meta)
    assert left.tolist() == [[1, 2, 3], [-1, 4, 5], [-1, 9, 9], [-1, -1, 6]]
    cut, keep = timeseries.transform(pd.Series(["1 2 3 4 5", None]), ts(missing_value_strategy="drop_row"), meta)
    assert cut[0].tolist() == [1, 2, 3] and keep.tolist() == [True, False]  # longer rows keep their start
    assert timeseries.fit(pd.Series(["1,2,3,4"]), ts(tokenizer="comma", timeseries_length_limit=2)) == {"length": 2}
    with pytest.raises(ConfigError, match=r"column 'ts' \(input_features 'ts', type timeseries\) holds values that are not series of "
                       r"finite numbers, such as \['1 b 3'\] \(first at row 1\)"):
        timeseries.check(pd.Series(["1 2", "1 b 3"]), ts(), "input_features")
    module, width = timeseries.encoder(ts(), meta)
    assert module.embed is None and [c.in_channels for c in module.convs] == [1] * 4
    assert width == 256 and module(torch.as_tensor(array)).shape == (4, 256)


def test_a_timeseries_model_learns_whether_the_series_rises(tmp_path):
    """The target is whether a row's last value is above its first, among 8 noisy
    values: Ludwig's parallel_cnn over the series learns it."""
    rng = np.random.default_rng(3)
    slope = rng.choice([-1.0, 1.0], 600)
    series = slope[:, None] * np.linspace(0, 1, 8) + rng.normal(0, 0.2, (600, 8))
    df = pd.DataFrame({"f": [" ".join(f"{v:.3f}" for v in row) for row in series], "y": slope > 0})
    config = CONFIG % "timeseries, encoder: {num_filters: 8, fc_layers: [{output_size: 8}]}"
    cfg, data = write(tmp_path, df=df, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] >= 0.95, out["evaluation"]


def test_ludwig_s_rendered_text_sequence_and_timeseries_config_trains_as_written(tmp_path):
    from pathlib import Path

    rendered = Path(__file__).parent.parent / "data" / "ludwig" / "text_sequence_timeseries.yaml"
    config = load_config(str(rendered), ["trainer.epochs=1", "input_features.0.preprocessing.max_sequence_length=6",
                                         "input_features.1.preprocessing.max_sequence_length=6"])
    assert [f.encoder.type for f in config.input_features] == ["parallel_cnn", "embed", "parallel_cnn"]
    rng = np.random.default_rng(0)
    df = pd.DataFrame({
        "t": [" ".join(rng.choice(["good", "bad", "film"], 4)) for _ in range(60)],
        "s": [" ".join(rng.choice(["GET", "POST"], 3)) for _ in range(60)],
        "ts": [" ".join(map(str, rng.normal(size=5).round(2))) for _ in range(60)],
        "y": rng.integers(0, 2, 60).astype(bool),
    })
    _, data = write(tmp_path, df=df)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    assert 0 <= out["evaluation"]["test"]["accuracy"] <= 1
