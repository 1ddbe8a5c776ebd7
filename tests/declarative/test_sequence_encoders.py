"""Ludwig's sequence encoders for text, sequence and timeseries inputs beyond parallel_cnn:
stacked_cnn, stacked_parallel_cnn, rnn, cnnrnn and transformer. Their settings as Ludwig's
rendered configs write them, what each module reads of a row (its tokens, not its
padding), and that each learns what a bag of embeddings cannot."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.declarative import api
from raylight.declarative.features import sequence, text, timeseries
from raylight.declarative.loading import load_config
from raylight.declarative.models.encoders import _pooled
from raylight.declarative.train import load_model
from tests.declarative_data import ORDER, negations, write

VOCAB = {"vocab": ["<PAD>", "<UNK>", "a", "b", "c", "d"]}


def build(encoder: dict, length: int = 8) -> torch.nn.Module:
    feat = text.TextInput(name="t", type="text", encoder=encoder, preprocessing={"max_sequence_length": length})
    module, width = text.encoder(feat, VOCAB)
    assert module.width == width
    return module.eval()


@pytest.mark.parametrize(
    "encoder",
    [
        {"type": "rnn", "state_size": 8},
        {"type": "rnn", "cell_type": "lstm", "bidirectional": True, "num_layers": 2, "state_size": 8, "reduce_output": "mean"},
        {"type": "rnn", "cell_type": "gru", "bidirectional": True, "state_size": 8, "reduce_output": "max"},
        {"type": "transformer", "embedding_size": 12, "hidden_size": 8, "num_heads": 2, "num_layers": 2},
        {"type": "transformer", "embedding_size": 8, "hidden_size": 8, "num_heads": 2, "reduce_output": "sum"},
        # one convolution, no pooling: its steps up to the last token see only zero embeddings beyond
        {"type": "cnnrnn", "conv_layers": [{"pool_size": None}], "num_filters": 6, "state_size": 8, "bidirectional": True},
    ],
    ids=["rnn-last", "lstm-both-ways-mean", "gru-both-ways-max", "transformer-projected", "transformer-sum", "cnnrnn"],
)
def test_rnn_and_transformer_read_a_row_s_tokens_not_its_padding(encoder):
    """A row's output is the same whatever padding follows it: the recurrent layers read
    packed rows (both ways too), the transformer masks the padding out of its attention,
    ``last`` is the output at the row's last token, and sum, mean and max reduce over the
    tokens only. A row of no tokens gives finite numbers."""
    torch.manual_seed(0)
    module = build(encoder)
    short, padded = torch.tensor([[2, 3, 4]]), torch.tensor([[2, 3, 4, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(module(short), module(padded), atol=1e-5)
        other = module(torch.tensor([[2, 3, 5, 0, 0, 0, 0, 0]]))
        assert not torch.allclose(other, module(padded), atol=1e-4)  # the tokens do matter
        assert torch.isfinite(module(torch.zeros(2, 8, dtype=torch.long))).all()
        batch = module(torch.tensor([[2, 3, 4, 0, 0, 0, 0, 0], [5, 4, 3, 2, 5, 4, 3, 2]]))
    assert torch.allclose(batch[:1], module(padded), atol=1e-5)  # rows of other lengths beside it change nothing
    module.train()
    assert module(padded).shape == (1, module.width)


def test_stacked_cnn_is_ludwig_s_six_layers_and_pools_where_they_say():
    enc = text.TextInput(name="t", type="text", encoder={"type": "stacked_cnn"}).encoder
    assert [(c.filter_size, c.pool_size) for c in enc.conv_layers] == [(7, 3), (7, 3), (3, None), (3, None), (3, None), (3, 3)]
    assert (enc.embedding_size, enc.reduce_output, [f.output_size for f in enc.fc_layers]) == (256, "sum", [512, 256])
    # a layer that leaves pool_size out takes the encoder's; one that writes null has none
    enc = text.TextInput(name="t", type="text", encoder={
        "type": "stacked_cnn", "pool_size": 2, "num_filters": 4, "conv_layers": [{}, {"pool_size": None}, {"filter_size": 5}],
        "fc_layers": [{"output_size": 3}],
    }).encoder
    assert [c.pool_size for c in enc.conv_layers] == [2, None, 2]
    for encoder in (enc, text.TextInput(name="t", type="text", encoder={"type": "rnn", "fc_activation": "tanh"}).encoder):
        assert text.TextEncoder.model_validate(encoder.model_dump(mode="json")) == encoder  # as a saved model's config
    module = build(enc.model_dump(exclude_unset=True), length=9)
    with torch.no_grad():
        steps = module.tokens(torch.ones(1, 9, dtype=torch.long)).transpose(1, 2)
        for conv, pool in zip(module.convs, module.pools, strict=True):
            steps = pool(conv(steps))
    assert steps.shape == (1, 4, 3)  # 9 -> 5 -> 5 -> 3
    assert [c.in_channels for c in module.convs] == [256, 4, 4] and module.width == 3


def test_stacked_parallel_cnn_stacks_ludwig_s_parallel_stages():
    enc = text.TextInput(name="t", type="text", encoder={"type": "stacked_parallel_cnn", "num_filters": 4, "pool_size": 2}).encoder
    assert [[(c.filter_size, c.pool_size) for c in stage] for stage in enc.stacked_layers] == [
        [(2, None), (3, None), (4, None), (5, None)]] * 2 + [[(2, 2), (3, 2), (4, 2), (5, 2)]]  # the encoder's pooling: the last stage
    assert (enc.reduce_output, [f.output_size for f in enc.fc_layers]) == ("sum", [512, 256])
    module = build(enc.model_dump(exclude_unset=True))
    assert [[c.in_channels for c in stage] for stage in module.stages] == [[256] * 4, [16] * 4, [16] * 4] and module.width == 256
    two = text.TextInput(name="t", type="text", encoder={"type": "stacked_parallel_cnn", "num_stacked_layers": 2}).encoder
    assert len(two.stacked_layers) == 2 and text.TextEncoder.model_validate(two.model_dump(mode="json")) == two


def test_cnnrnn_is_ludwig_s_convolutions_then_recurrent_layers():
    """Ludwig's cnnrnn: two convolutions of width 5 (pooling by 3 after the first; its own
    activation and dropout), then recurrent layers (``num_rec_layers``), the output at the
    last token's step, no layers; the steps a pooling leaves of a row are the ceiling."""
    enc = text.TextInput(name="t", type="text", encoder={
        "type": "cnnrnn", "num_rec_layers": 2, "cell_type": "lstm", "conv_activation": "tanh", "conv_dropout": 0.2,
        "activation": "tanh", "fc_activation": "elu", "num_fc_layers": 1, "output_size": 4,
    }).encoder
    assert (enc.filter_size, [c.pool_size for c in enc.conv_layers], enc.num_layers, enc.reduce_output) == (5, [3, None], 2, "last")
    module = build(enc.model_dump(exclude_unset=True), length=10)
    assert isinstance(module.rnn, torch.nn.LSTM) and module.rnn.num_layers == 2 and module.rnn.input_size == 256
    assert isinstance(module.activation, torch.nn.Tanh) and module.conv_dropout.p == 0.2
    assert [type(m).__name__ for m in module.fc] == ["Linear", "ELU"]
    assert text.TextInput(name="t", type="text", encoder={"type": "cnnrnn"}).encoder.fc_layers == []
    assert _pooled(torch.tensor([1, 2, 3, 4, 6, 7]), 3).tolist() == [1, 1, 1, 2, 2, 3] and _pooled(None, 3) is None
    with torch.no_grad():
        assert module(torch.tensor([[2, 3, 4, 0, 0, 0, 0, 0, 0, 0], [0] * 10])).shape == (2, 4)


@pytest.mark.parametrize(
    "encoder", [{}, {"type": "stacked_cnn"}, {"type": "stacked_parallel_cnn"}, {"type": "rnn"}, {"type": "cnnrnn"}, {"type": "transformer"}]
)
def test_every_sequence_encoder_takes_a_timeseries_of_any_length(encoder):
    feat = timeseries.TimeseriesInput(name="s", type="timeseries", encoder=encoder)
    for length in (1, 2, 5, 30):
        module, width = timeseries.encoder(feat, {"length": length})
        assert module(torch.randn(3, length)).shape == (3, width)


@pytest.mark.parametrize(
    ("encoder", "message"),
    [
        ({"cell_type": "lstm"}, "cell_type: settings of the cnnrnn and rnn encoders; give the encoder one of those types"),
        ({"type": "rnn", "num_filters": 8}, "num_filters: settings of the cnnrnn, parallel_cnn, stacked_cnn and stacked_parallel_cnn encoders"),
        ({"type": "parallel_cnn", "num_heads": 4}, "num_heads: settings of the transformer encoder"),
        ({"type": "stacked_cnn", "reduce_output": "last"}, "reduce_output: last is for the rnn, cnnrnn and transformer encoders"),
        ({"type": "transformer", "num_heads": 3}, "hidden_size 256 is not a multiple of num_heads 3"),
        ({"type": "rnn", "activation": "sigmoid"}, "activation: the rnn encoder's layers take fc_activation"),
        ({"type": "transformer", "activation": "gelu"}, "activation: the transformer encoder's layers take fc_activation"),
        ({"type": "parallel_cnn", "conv_layers": [{"pool_size": 2}, {}]}, "conv_layers: convolutions side by side .* one pool_size"),
        ({"type": "stacked_parallel_cnn", "stacked_layers": [[{}], [{"pool_size": 2}, {"pool_size": 3}]]}, "stacked_layers.1: convolutions side by side"),
        ({"type": "stacked_cnn", "stacked_layers": [[{}]]}, "stacked_layers: settings of the stacked_parallel_cnn encoder"),
        ({"type": "cnnrnn", "activation": "gelu"}, "its convolutions take conv_activation"),
        ({"type": "rnn", "conv_dropout": 0.1}, "conv_dropout: settings of the cnnrnn encoder"),
        ({"type": "rnn", "num_rec_layers": 2}, "num_rec_layers"),
    ],
)
def test_an_encoder_setting_of_another_type_or_that_cannot_work_is_an_error(encoder, message):
    with pytest.raises(ValueError, match=message):
        text.TextInput(name="t", type="text", encoder=encoder)


def test_rnn_and_transformer_layers_take_ludwig_s_fc_keys():
    """Ludwig's rnn and transformer give their layers fc_activation and fc_dropout, and
    dropout to the embeddings (and a transformer's blocks, 0.1 by default); Ludwig's
    rendered rnn writes activation: tanh, which reaches no layer there either."""
    enc = text.TextInput(name="t", type="text", encoder={
        "type": "rnn", "activation": "tanh", "dropout": 0.3, "fc_dropout": 0.2, "fc_activation": "elu", "num_fc_layers": 1, "output_size": 4,
    }).encoder
    module = build(enc.model_dump(exclude_unset=True))
    assert [type(m).__name__ for m in module.fc] == ["Linear", "ELU", "Dropout"] and module.fc[2].p == 0.2
    assert module.dropout.p == 0.3
    assert text.TextInput(name="t", type="text", encoder={"type": "transformer"}).encoder.dropout == 0.1
    assert sequence.SequenceInput(name="s", type="sequence", encoder={"type": "rnn"}).encoder.reduce_output == "last"


@pytest.mark.parametrize(
    "encoder",
    [
        "{type: stacked_cnn, embedding_size: 16, num_filters: 16, num_conv_layers: 2, fc_layers: [{output_size: 16}]}",
        "{type: rnn, cell_type: gru, embedding_size: 16, state_size: 16}",
        "{type: transformer, embedding_size: 16, hidden_size: 16, num_heads: 2, transformer_output_size: 32, dropout: 0.0}",
        "{type: stacked_parallel_cnn, embedding_size: 16, num_filters: 8, num_stacked_layers: 2, fc_layers: [{output_size: 16}]}",
        "{type: cnnrnn, embedding_size: 16, num_filters: 16, state_size: 16, cell_type: gru}",
    ],
    ids=["stacked_cnn", "rnn", "transformer", "stacked_parallel_cnn", "cnnrnn"],
)
def test_each_encoder_learns_word_order_and_predicts_after_loading(tmp_path, encoder):
    """Reviews of 3 to 6 words (so "last" is a different step in each row) where the target
    is the order of two words: the mean bag of embeddings cannot tell the classes apart
    (tests/declarative/test_features.py shows it), each of these encoders does."""
    cfg, data = write(tmp_path, df=negations(600), config=ORDER % encoder)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] >= 0.95, out["evaluation"]["test"]
    model = load_model(str(tmp_path / "run" / "model"))
    held_out = negations(40, seed=1)
    predicted = model.predict(held_out[["review"]])["y_predictions"]
    assert (predicted.to_numpy() == held_out["y"].to_numpy()).mean() >= 0.95


def test_ludwig_s_rendered_sequence_encoders_config_trains(tmp_path):
    """tests/data/ludwig/sequence_encoders.yaml, as Ludwig 0.17.10 wrote it: text through a
    two-way GRU and through cnnrnn, sequences through a transformer and stacked_parallel_cnn,
    a timeseries through stacked_cnn, each at the settings it names and Ludwig's defaults for
    the rest."""
    rendered = os.path.join(os.path.dirname(__file__), "..", "data", "ludwig", "sequence_encoders.yaml")
    config = load_config(rendered, ["trainer.epochs=1", *(f"input_features.{i}.preprocessing.max_sequence_length=6" for i in (0, 1, 3, 4))])
    review, path, load, note, steps = (f.encoder for f in config.input_features)
    assert (review.type, review.cell_type, review.bidirectional, review.state_size, review.reduce_output) == ("rnn", "gru", True, 256, "last")
    assert (path.type, path.hidden_size, path.num_heads, path.embedding_size, path.dropout, path.reduce_output) == (
        "transformer", 64, 4, 256, 0.1, "last",
    )
    assert (load.type, len(load.conv_layers), [f.output_size for f in load.fc_layers]) == ("stacked_cnn", 6, [512, 256])
    assert (note.type, note.cell_type, note.num_layers, note.filter_size, len(note.conv_layers), note.fc_layers) == ("cnnrnn", "lstm", 2, 5, 2, [])
    assert (steps.type, steps.num_filters, len(steps.stacked_layers), steps.reduce_output) == ("stacked_parallel_cnn", 32, 3, "sum")
    rng = np.random.default_rng(0)
    words = ["good", "bad", "film", "plot"]
    df = pd.DataFrame({
        "review": [" ".join(rng.choice(words, 3)) for _ in range(60)],
        "path": [" ".join(rng.choice(["/a", "/b", "GET"], 4)) for _ in range(60)],
        "load": [" ".join(str(v) for v in rng.normal(size=int(rng.integers(2, 9))).round(2)) for _ in range(60)],
        "note": [" ".join(rng.choice(words, int(rng.integers(1, 6)))) for _ in range(60)],
        "steps": [" ".join(rng.choice(["/a", "/b", "GET"], 5)) for _ in range(60)],
        "y": rng.integers(0, 2, 60).astype(bool),
    })
    _, data = write(tmp_path, df=df)
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    model = load_model(out["model_path"])
    weights, embeddings = model.model.state_dict(), model.model.embeddings
    assert "embeddings.review.rnn.weight_hh_l0_reverse" in weights and embeddings["review"].width == 512
    assert embeddings["path"].blocks.layers[0].self_attn.num_heads == 4
    assert "embeddings.note.rnn.weight_hh_l1" in weights and embeddings["note"].width == 256
    assert embeddings["steps"].stages[2][0].in_channels == 128 and embeddings["steps"].width == 256
    assert len(model.predict(df.drop(columns="y").head(5))) == 5
