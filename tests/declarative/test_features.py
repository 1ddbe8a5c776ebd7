"""Declarative feature types as a family: each built-in type is a module listed in
FEATURES, and a new type is one module plus one entry (tests/squared_feature.py, added
here with monkeypatch), taken up by the config, preprocessing, the model and prediction."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.features import FEATURES, FeatureType, infer_type
from raylight.declarative.loading import load_config, render_config
from raylight.declarative.preprocess import transform
from raylight.declarative.train import load_model
from tests import squared_feature
from tests.declarative_data import CONFIG, ORDER, frame, negations, write

MEMBERS = sorted({*FeatureType.__annotations__, *(n for n in vars(FeatureType) if not n.startswith("_"))})
SQUARED = CONFIG.replace("{name: age, type: number}", "{name: age, type: squared, preprocessing: {offset: 40}}").replace(
    "epochs: 6", "epochs: 2"
)


@pytest.mark.parametrize("module", [*FEATURES.values(), squared_feature], ids=[*FEATURES, "squared"])
def test_every_type_module_has_the_whole_interface(module):
    assert MEMBERS == ["INFER_RANK", "Input", "block_summary", "check", "check_blocks", "encoder", "fit", "fit_ray", "infers", "transform"]
    for name in MEMBERS:
        assert hasattr(module, name), name


@pytest.mark.parametrize("name", list(FEATURES))
def test_a_types_model_is_named_by_its_key(name):
    assert FEATURES[name].Input.model_fields["type"].annotation == Literal[name]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (pd.Series([1, 2, 1]), "binary"),
        (pd.Series(["Yes", "no"]), "binary"),  # two values read as true and false: binary before text
        (pd.Series(["a b c d e", "f g h i j"]), "text"),  # two values both false as binary: not binary
        (pd.Series([], dtype=float), "binary"),
        (pd.Series(list(range(21))), "number"),
        (pd.Series(list(range(20))), "category"),  # few numbers: classes
        (pd.Series(np.linspace(0, 1, 30)), "number"),
        (pd.Series(["a b c d e", "v w x y z", "q"] * 5), "text"),  # more than three words on average
        (pd.Series(["a b c", "d e f", "g h i"]), "category"),
        (pd.Series(["x", "y", "z"]), "category"),
    ],
)
def test_inference_rules_in_rank_order(values, expected):
    assert infer_type(values) == expected


def test_pass_through_encoders_add_no_weights(tmp_path):
    cfg, data = write(tmp_path)
    config = load_config(cfg)
    prepared = api.prepare(config, data)
    from raylight.declarative.models import build_model

    model = build_model(config, prepared.meta)
    assert isinstance(model.embeddings["age"], torch.nn.Identity) and isinstance(model.embeddings["smoker"], torch.nn.Identity)
    assert sorted(k for k in model.state_dict() if k.startswith("embeddings.")) == ["embeddings.review.weight", "embeddings.workclass.weight"]


def test_a_new_type_is_one_module_and_one_entry(tmp_path, monkeypatch):
    cfg, data = write(tmp_path, config=SQUARED)
    with pytest.raises(ConfigError, match="does not match any of the expected tags: 'number', 'category', 'binary', 'text', 'date', 'set', 'bag', 'vector', 'sequence', 'timeseries', 'image' "):
        load_config(cfg)
    with monkeypatch.context() as m:
        m.setitem(FEATURES, "squared", squared_feature)
        # The config takes the type, with its own sections and key paths.
        config = load_config(cfg)
        feat = config.input_features[0]
        assert isinstance(feat, squared_feature.SquaredInput) and feat.preprocessing.offset == 40
        assert "type: squared" in render_config(config) and "offset: 40.0" in render_config(config)
        with pytest.raises(ConfigError, match=r"input_features\.0\.encoder\.width: Input should be less than or equal to 64"):
            load_config(cfg, ["input_features.0.encoder.width=100"])
        with pytest.raises(ConfigError, match="'number', 'category', 'binary', 'text', 'date', 'set', 'bag', 'vector', 'sequence', 'timeseries', 'image', 'squared'"):
            load_config(cfg, ["input_features.0.type=cube"])
        # Its checks, statistics and transform run in preprocessing.
        (tmp_path / "bad").mkdir()
        with pytest.raises(ConfigError, match=r"column 'age' \(input_features 'age', type number\) holds non-numeric"):
            api.prepare(config, write(tmp_path / "bad", df=frame().assign(age="old"))[1])
        prepared = api.prepare(config, data)
        m = prepared.meta["age"]
        assert set(m) == {"mean", "std"} and m["mean"] > 0
        assert abs(prepared.train["age"].mean()) < 0.2  # standardised on the training split
        df = frame()
        arrays, _ = transform(df, config, prepared.meta, with_outputs=False)
        squares = ((df["age"] - 40) ** 2).fillna(m["mean"])  # a missing age: the mean square
        np.testing.assert_allclose(arrays["age"][:, 0], ((squares - m["mean"]) / m["std"]).to_numpy(np.float32), rtol=1e-6)
        # Its encoder is part of the model, trained and saved with it.
        out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
        model = load_model(out["model_path"])
        assert isinstance(model.model.embeddings["age"], torch.nn.Linear)
        assert "embeddings.age.weight" in model.model.state_dict()
        assert model.model.combiner[0].in_features == 2 + 32 + 1 + 32
        pred = model.predict(frame(30, seed=1))
        assert len(pred) == 30 and pred["income_probabilities"].between(0, 1).all()
        # init-config does not give it to any column (its rule claims none).
        assert "squared" not in {f["type"] for f in api.init_config(data, "income")["input_features"]}
    # Gone from FEATURES, gone from the config.
    with pytest.raises(ConfigError, match="'audio'"):
        load_config(cfg, ["input_features.0.type=audio"])
    with pytest.raises(ConfigError, match="'squared' found using 'type' does not match"):
        load_config(cfg)


@pytest.mark.parametrize(
    ("strategy", "expected", "kept"),
    [
        (None, [0, 1, -30, 50, 60], None),
        ("fill_with_mean", [0, 1, -30, 50, 10], None),
        ("fill_with_const", [0, 1, -30, 50, 7], None),
        ("drop_row", [0, 1, -30, 50, 60], [True, True, True, True, False]),
    ],
)
def test_number_outliers_are_replaced_as_ludwig_s_outlier_strategy_says(strategy, expected, kept):
    """Ludwig's ``outlier_strategy``: a value more than ``outlier_threshold`` standard
    deviations from the training split's mean is an outlier, replaced by the mean or
    fill_value, or its row dropped; values within it (or at it) stay."""
    from raylight.declarative.features import number

    feat = number.NumberInput(
        name="x", type="number",
        preprocessing={"normalization": "none", "outlier_strategy": strategy, "outlier_threshold": 2.0, "fill_value": 7},
    )
    meta = {"mean": 10.0, "std": 20.0, "min": 0.0, "span": 1.0}  # 60 is 2.5 deviations away; 50 and -30, 2
    array, keep = number.transform(pd.Series([0, 1, -30, 50, 60]), feat, meta)
    assert array[:, 0].tolist() == expected
    assert (keep.tolist() if keep is not None else None) == kept


def test_the_combiner_s_layers_are_ludwig_s_fc_stack():
    """Each layer: linear (bias per use_bias), normalisation, activation, dropout, each
    overridable per layer; norm also normalises the inputs; residual adds a layer's input
    where the widths match. The default combiner's weights keep their names."""
    from raylight.declarative.config.model import CombinerConfig
    from raylight.declarative.models.ecd import FCStack

    default = FCStack(CombinerConfig(fc_layers=[{"output_size": 8}, {"output_size": 4}], dropout=0.1), 6)
    assert list(default.state_dict()) == ["0.weight", "0.bias", "3.weight", "3.bias"]  # Linear, ReLU, Dropout, Linear
    c = CombinerConfig(
        fc_layers=[{"output_size": 6}, {"output_size": 3, "activation": "tanh", "norm": "layer", "use_bias": True, "dropout": 0.0}],
        activation="gelu", norm="batch", use_bias=False, residual=True, dropout=0.2,
    )
    stack = FCStack(c, 6)
    kinds = [type(m).__name__ for m in stack]
    assert kinds == ["_BatchNorm", "Linear", "_BatchNorm", "GELU", "Dropout", "Linear", "LayerNorm", "Tanh"]
    assert stack[1].bias is None and stack[5].bias is not None and stack.width == 3
    stack.eval()
    x = torch.randn(5, 6)
    with torch.no_grad():
        normed = stack[0](x)
        first = normed + stack[3](stack[2](stack[1](normed)))  # residual: 6 -> 6
        second = stack[7](stack[6](stack[5](first)))  # 6 -> 3: no residual
        assert torch.allclose(stack(x), second, atol=1e-6)
    stack.train()
    assert stack(torch.randn(1, 6)).shape == (1, 3)  # a one-row batch in training (batch norm)


def test_a_ludwig_combiner_with_norm_and_residual_trains_and_predicts(tmp_path):
    config = CONFIG.replace("epochs: 6", "epochs: 1").replace(
        "combiner: {type: concat, fc_layers: [{output_size: 32}], dropout: 0.1}",
        "combiner: {type: concat, num_fc_layers: 2, output_size: 16, norm: batch, residual: true, activation: tanh}",
    )
    cfg, data = write(tmp_path, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] > 0.5
    model = load_model(str(tmp_path / "run" / "model"))
    assert [fc.output_size for fc in model.config.combiner.fc_layers] == [16, 16] and model.config.combiner.residual
    assert len(model.predict(frame(7, seed=3))) == 7


def test_parallel_cnn_reads_word_order_a_bag_of_embeddings_cannot(tmp_path):
    """Reviews whose target is the order of "not" and "good" (``negations``): the mean bag
    can do no better than chance, and Ludwig's ParallelCNN (2-wide filters see the pair)
    learns it."""
    df = negations(600)
    accuracy = {}
    for name, encoder in (("embed", "{}"), ("parallel_cnn", "{type: parallel_cnn, embedding_size: 16, num_filters: 16, fc_layers: [{output_size: 16}]}")):
        (tmp_path / name).mkdir()
        cfg, data = write(tmp_path / name, df=df, config=ORDER % encoder)
        out = api.train(load_config(cfg), data, output_directory=str(tmp_path / name / "run"), progress=False)
        accuracy[name] = out["evaluation"]["test"]["accuracy"]
    assert accuracy["parallel_cnn"] >= 0.95 and accuracy["embed"] <= 0.7, accuracy
    model = load_model(str(tmp_path / "parallel_cnn" / "run" / "model"))
    convs = [k for k in model.model.state_dict() if k.startswith("embeddings.review.convs.") and k.endswith(".weight")]
    assert len(convs) == 4  # Ludwig's widths 2, 3, 4 and 5
    assert model.predict(pd.DataFrame({"review": ["the film was not good", "good not the plot"]}))["y_predictions"].tolist() == [True, False]


def test_ludwig_s_rendered_text_config_trains_its_parallel_cnn(tmp_path):
    """tests/data/ludwig/text_parallel_cnn.yaml, as Ludwig 0.17.10 wrote it for a text
    input with no encoder: its parallel_cnn at Ludwig's sizes trains and predicts."""
    import os

    rendered = os.path.join(os.path.dirname(__file__), "..", "data", "ludwig", "text_parallel_cnn.yaml")
    config = load_config(rendered, ["trainer.epochs=1", "input_features.0.preprocessing.max_sequence_length=8"])
    enc = config.input_features[0].encoder
    assert (enc.type, enc.embedding_size, enc.reduce_output, [f.output_size for f in enc.fc_layers]) == ("parallel_cnn", 256, "sum", [512, 256])
    df = frame(60).assign(x=np.arange(60.0), y=["a", "b", "c"] * 20)[["review", "x", "y"]]
    _, data = write(tmp_path, df=df)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    assert load_model(out["model_path"]).model.embeddings["review"].width == 256


def test_text_encoder_settings_belong_to_their_type():
    from raylight.declarative.features import text

    feat = text.TextInput(name="t", type="text", encoder={"fc_layers": [{"output_size": 4}], "dropout": 0.1})
    module, width = text.encoder(feat, {"vocab": ["<PAD>", "<UNK>", "a"]})
    assert width == 4 and module(torch.tensor([[2, 0], [1, 2]])).shape == (2, 4)
    plain, width = text.encoder(text.TextInput(name="t", type="text"), {"vocab": ["<PAD>", "<UNK>", "a"]})
    assert isinstance(plain, torch.nn.EmbeddingBag) and width == 32  # weights files keep embeddings.<name>.weight
    with pytest.raises(ValueError, match="filter_size: settings of the cnnrnn, parallel_cnn, stacked_cnn and stacked_parallel_cnn encoders"):
        text.TextInput(name="t", type="text", encoder={"filter_size": 5})
    summed, _ = text.encoder(text.TextInput(name="t", type="text", encoder={"type": "embed"}), {"vocab": ["<PAD>", "<UNK>", "a", "b"]})
    ids = torch.tensor([[2, 3, 2, 0]])
    assert torch.allclose(summed(ids)[0], summed.weight[[2, 3, 2]].sum(0))  # Ludwig's embed: the sum, padding left out
    cnn = text.TextInput(name="t", type="text", encoder={"type": "parallel_cnn", "num_conv_layers": 2, "filter_size": 4, "pool_size": 2})
    assert [c.filter_size for c in cnn.encoder.conv_layers] == [None, None] and cnn.encoder.embedding_size == 256
    module, width = text.encoder(cnn, {"vocab": ["<PAD>", "<UNK>", "a"]})
    assert width == 256 and [c.kernel_size for c in module.convs] == [(4,), (4,)] and module(torch.tensor([[2, 0, 1]])).shape == (1, 256)


def test_sequence_features_are_text_with_ludwig_s_sequence_defaults(tmp_path):
    """A sequence (Ludwig's type) splits on white space, keeps case and 256 tokens, and
    sums 256-wide embeddings (Ludwig's sequence embed encoder); Ludwig's rendered config
    for one (tests/data/ludwig/sequence_embed.yaml) trains as it is."""
    import os

    from raylight.declarative.features import sequence

    feat = sequence.SequenceInput(name="s", type="sequence")
    p, e = feat.preprocessing, feat.encoder
    assert (p.tokenizer, p.lowercase, p.max_sequence_length, e.type, e.reduce_output, e.embedding_size) == ("space", False, 256, "embed", "sum", 256)
    col = pd.Series(["GET /a GET", "POST /b", None])
    meta = sequence.fit(col, feat)
    assert meta["vocab"] == ["<PAD>", "<UNK>", "GET", "/a", "POST", "/b"]  # ties in order of appearance
    ids, _ = sequence.transform(col, feat, meta)
    assert ids[:, :3].tolist() == [[2, 3, 2], [4, 5, 0], [0, 0, 0]]  # in order, padded
    cnn = sequence.SequenceInput(name="s", type="sequence", encoder={"type": "parallel_cnn", "num_filters": 4, "embedding_size": 4})
    assert sequence.encoder(cnn, meta)[1] == 256
    rendered = os.path.join(os.path.dirname(__file__), "..", "data", "ludwig", "sequence_embed.yaml")
    config = load_config(rendered, ["trainer.epochs=1"])
    assert config.input_features[0].encoder.reduce_output == "sum"
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"s": [" ".join(rng.choice(["GET", "POST", "/a", "/b"], 4)) for _ in range(80)], "x": rng.normal(size=80), "y": rng.integers(0, 2, 80).astype(bool)})
    _, data = write(tmp_path, df=df)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    assert load_model(out["model_path"]).model.embeddings["s"].mode == "sum"


def test_fill_with_mode_takes_the_training_split_s_most_common_value():
    """Ludwig's ``fill_with_mode`` (number, category, binary) and ``fill_with_true``
    (binary): a missing value becomes the training split's most common one, the smallest
    of those tied (so both processors agree), and a column with no value says so."""
    from raylight.declarative.features import binary, category, number

    num = number.NumberInput(name="x", type="number", preprocessing={"missing_value_strategy": "fill_with_mode", "normalization": None})
    meta = number.fit(pd.Series([1.0, 3.0, 3.0, None, 2.0, 2.0, 7.5]), num)
    assert meta["mode"] == 2.0  # 2 and 3 tie: the smaller
    assert number.transform(pd.Series([None, 5.0]), num, meta)[0].ravel().tolist() == [2.0, 5.0]
    cat = category.CategoryInput(name="c", type="category", preprocessing={"missing_value_strategy": "fill_with_mode"})
    meta = category.fit(pd.Series(["red", "blue", None, "blue", "green"]), cat)
    ids, _ = category.transform(pd.Series([None, "red"]), cat, meta)
    assert meta["mode"] == "blue" and [meta["vocab"][i] for i in ids] == ["blue", "red"]
    assert "mode" not in category.fit(pd.Series(["a"]), category.CategoryInput(name="c", type="category"))  # only where it is used
    flag = binary.BinaryInput(name="b", type="binary", preprocessing={"missing_value_strategy": "fill_with_mode"})
    meta = binary.fit(pd.Series(["yes", "yes", None, "no"]), flag)
    assert meta == {"mode": 1.0} and binary.transform(pd.Series([None, "no"]), flag, meta)[0].ravel().tolist() == [1.0, 0.0]
    assert binary.fit(pd.Series(["yes", "no"]), flag) == {"mode": 0.0}  # a tie: false
    always = binary.BinaryInput(name="b", type="binary", preprocessing={"missing_value_strategy": "fill_with_true"})
    assert binary.transform(pd.Series([None, "no"]), always, {})[0].ravel().tolist() == [1.0, 0.0]
    from raylight.declarative.features.base import mode

    assert mode(pd.Series([3, 2, 2], index=["red", "blue", "blue"]), cat) == "blue"  # one value's counts from two blocks add up
    with pytest.raises(ConfigError, match=r"'c': preprocessing\.missing_value_strategy fill_with_mode takes the most common value of the training split, and column 'c' has none there"):
        category.fit(pd.Series([None, None]), cat)
