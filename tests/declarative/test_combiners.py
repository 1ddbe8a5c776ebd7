"""Ludwig's combiners as a family (raylight.declarative.combiners): each type is a module
listed in COMBINERS, built from a Ludwig-style config section, trained through its
gradients; bad settings name their key path and the fix; a few train end to end."""

from __future__ import annotations

import json
import typing

import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.combiners import COMBINERS
from raylight.declarative.combiners.base import CombinerType
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.loading import load_config
from raylight.declarative.models.ecd import build_model
from raylight.declarative.models.tabnet import GhostBatchNorm, entmax, sparsemax
from raylight.declarative.suggest import validate_config
from raylight.declarative.train import load_model
from tests.declarative_data import CONFIG, frame, write

LENGTH = 7
INPUTS = [
    {"name": "a", "type": "number"},
    {"name": "c", "type": "category"},
    {"name": "b", "type": "binary"},
    # an output per step (Ludwig's reduce_output: null), which the sequence combiners read
    {"name": "t", "type": "text", "preprocessing": {"max_sequence_length": LENGTH},
     "encoder": {"type": "rnn", "reduce_output": None, "state_size": 8, "embedding_size": 8}},
]
META = {"a": {"mean": 0.0, "std": 1.0}, "c": {"vocab": ["<UNK>", "x", "y"]}, "b": {}, "t": {"vocab": ["<PAD>", "<UNK>", "w", "v"]}, "y": {}}

# Ludwig-style sections (Ludwig's keys: num_fc_layers, output_size, fc_dropout, ...) and
# the combiner's output width each gives.
SECTIONS = {
    "concat": ({"type": "concat", "num_fc_layers": 2, "output_size": 8}, 8),
    "transformer": ({"type": "transformer", "hidden_size": 16, "num_heads": 2, "num_fc_layers": 1, "output_size": 8, "fc_dropout": 0.1}, 8),
    # concat of the two embedded inputs' 16 (c, t), beside a and b's 2; no layers
    "tabtransformer": ({"type": "tabtransformer", "hidden_size": 16, "num_heads": 2, "embed_input_feature_name": 4}, 2 * 16 + 2),
    "ft_transformer": ({"type": "ft_transformer", "hidden_size": 16, "num_heads": 4, "num_fc_layers": 1, "output_size": 6}, 6),
    "project_aggregate": ({"type": "project_aggregate", "projection_size": 8, "output_size": 8}, 8),
    "tabnet": ({"type": "tabnet", "size": 4, "output_size": 8, "num_steps": 2, "bn_virtual_bs": 2}, 8),
    "comparator": ({"type": "comparator", "entity_1": ["a", "c"], "entity_2": ["b", "t"], "output_size": 8}, 2 * 8 + 2),
    # every step: t's 8, a's 1, c's embedding, b's 1 (the tiling test checks the widths)
    "sequence_concat": ({"type": "sequence_concat", "reduce_output": "mean"}, None),
    "sequence": ({"type": "sequence", "encoder": {"type": "rnn", "state_size": 4}, "reduce_output": "last"}, 4),
    "hypernetwork": ({"type": "hypernetwork", "hidden_size": 4, "hyper_hidden_size": 8, "num_fc_layers": 1, "output_size": 8}, 8),
}


def model_of(section: dict, inputs: list[dict] = INPUTS):
    cfg = ModelConfig.model_validate({"input_features": inputs, "output_features": [{"name": "y", "type": "binary"}], "combiner": section})
    return cfg, build_model(cfg, {**META, "u": META["t"]})


def batch(rows: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 4, (rows, LENGTH), generator=g)
    ids[::2, 4:] = 0  # shorter rows: padding
    return {"a": torch.randn(rows, 1, generator=g), "c": torch.randint(0, 3, (rows,), generator=g),
            "b": torch.randint(0, 2, (rows, 1), generator=g).float(), "t": ids}


def test_every_combiner_module_is_a_combiner_type_named_by_its_key():
    members = sorted({*CombinerType.__annotations__, *(n for n in vars(CombinerType) if not n.startswith("_"))})
    assert members == ["Config", "build"]
    for name, module in COMBINERS.items():
        assert all(hasattr(module, m) for m in members), name
        field = module.Config.model_fields["type"]
        assert field.annotation == typing.Literal[name], name
    assert sorted(SECTIONS) == sorted(COMBINERS)


@pytest.mark.parametrize("kind", list(SECTIONS))
def test_each_combiner_builds_from_a_ludwig_section_and_trains_through_it(kind):
    section, width = SECTIONS[kind]
    # concat takes one vector per input: t's rnn reduced to its last step's output
    inputs = INPUTS if kind != "concat" else [*INPUTS[:3], {**INPUTS[3], "encoder": {**INPUTS[3]["encoder"], "reduce_output": "last"}}]
    cfg, model = model_of(section, inputs)
    assert cfg.combiner.type == kind
    if width is not None:
        assert model.combiner.width == width
    out = model(batch())["y"]
    assert out.shape == (6,) and torch.isfinite(out).all()
    out.sum().backward()
    # the gradient reaches every input's encoder that has weights (c's embedding, t's rnn)
    for name in ("c", "t"):
        grads = [p.grad for p in model.embeddings[name].parameters()]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads), (kind, name)
    rendered = ModelConfig.model_validate(cfg.model_dump(mode="json"))  # a saved config loads as it was
    assert rendered.combiner == cfg.combiner


def test_a_combiner_section_names_concat_by_default_and_keeps_its_weights_names():
    cfg, model = model_of({"fc_layers": [{"output_size": 8}]}, INPUTS[:3])
    assert cfg.combiner.type == "concat"
    assert [k for k in model.state_dict() if k.startswith("combiner.")] == ["combiner.0.weight", "combiner.0.bias"]


_TRANSFORMER_RENDERED = {
    "dropout": 0.1, "transformer_output_size": 256, "hidden_size": 256, "num_layers": 1, "num_heads": 8, "use_bias": True,
    "bias_initializer": "zeros", "weights_initializer": "xavier_uniform", "num_fc_layers": 0, "output_size": 256,
    "norm": None, "norm_params": None, "fc_layers": None, "fc_dropout": 0.0, "fc_activation": "relu", "fc_residual": False,
}
# Each section as Ludwig 0.17's schema renders it (every key at its default; comparator's
# entities given), and what raylight makes of a few of its keys.
RENDERED = [
    ({"type": "transformer", "reduce_output": "mean", **_TRANSFORMER_RENDERED}, {"hidden_size": 256, "fc_layers": []}),
    ({"type": "tabtransformer", "embed_input_feature_name": None, "reduce_output": "concat", **_TRANSFORMER_RENDERED}, {"reduce_output": "concat"}),
    ({"type": "ft_transformer", **_TRANSFORMER_RENDERED}, {"num_heads": 8, "dropout": 0.1}),
    ({"type": "project_aggregate", "projection_size": 128, "residual": True, "dropout": 0.0, "activation": "relu", "num_fc_layers": 2,
      "output_size": 128, "norm": "layer", "norm_params": None, "fc_layers": None, "use_bias": True, "bias_initializer": "zeros",
      "weights_initializer": "xavier_uniform"}, {"norm": "layer", "residual": True}),
    ({"type": "tabnet", "size": 32, "dropout": 0.05, "output_size": 128, "num_steps": 3, "num_total_blocks": 4, "num_shared_blocks": 2,
      "relaxation_factor": 1.5, "bn_epsilon": 0.001, "bn_momentum": 0.05, "bn_virtual_bs": 1024, "sparsity": 0.0001,
      "entmax_mode": "sparsemax", "entmax_alpha": 1.5}, {"num_steps": 3}),
    ({"type": "comparator", "entity_1": ["a"], "entity_2": ["t"], "dropout": 0.0, "activation": "relu", "use_bias": True,
      "bias_initializer": "zeros", "weights_initializer": "xavier_uniform", "num_fc_layers": 1, "output_size": 256, "norm": None,
      "norm_params": None, "fc_layers": None}, {"entity_2": ["t"]}),
    ({"type": "sequence_concat", "main_sequence_feature": None, "reduce_output": None}, {"reduce_output": None}),
]


@pytest.mark.parametrize(("section", "expected"), RENDERED, ids=[s["type"] for s, _ in RENDERED])
def test_a_section_as_ludwig_renders_it_loads_at_its_defaults(section, expected):
    inputs = [{"name": "a", "type": "number"}, {"name": "t", "type": "text", "encoder": {"type": "rnn", "reduce_output": None}}]
    cfg = validate_config({"input_features": inputs, "output_features": [{"name": "y", "type": "binary"}], "combiner": section})
    for key, value in expected.items():
        assert getattr(cfg.combiner, key) == value, key
    # and each of those defaults is raylight's own where the section names only the type
    entities = {k: v for k, v in section.items() if k.startswith("entity_")}
    bare = validate_config({"input_features": inputs, "output_features": [{"name": "y", "type": "binary"}],
                            "combiner": {"type": section["type"], **entities}})
    assert bare.combiner == cfg.combiner


def test_sparsemax_is_the_projection_onto_the_simplex():
    # sorted 1, 0.5, -1: the support is the first two, tau = (1.5 - 1) / 2
    assert torch.allclose(sparsemax(torch.tensor([[1.0, 0.5, -1.0]])), torch.tensor([[0.75, 0.25, 0.0]]))
    z = torch.randn(64, 9) * 3
    p = sparsemax(z)
    assert (p >= 0).all() and torch.allclose(p.sum(-1), torch.ones(64), atol=1e-6)
    # the projection: no point of the simplex nearer (against random points of it)
    others = torch.distributions.Dirichlet(torch.ones(9)).sample((64, 200))
    assert ((p - z).square().sum(-1)[:, None] <= (others - z[:, None]).square().sum(-1) + 1e-5).all()
    assert (p == 0).any()  # sparse, as softmax never is


def test_entmax_runs_from_softmax_to_sparsemax():
    z = torch.randn(16, 6)
    assert torch.allclose(entmax(z, 2.0), sparsemax(z), atol=1e-4)
    assert torch.allclose(entmax(z, 1.001), torch.softmax(z, -1), atol=1e-2)
    p = entmax(z, 1.5)
    assert torch.allclose(p.sum(-1), torch.ones(16), atol=1e-5) and (p >= 0).all()


def test_ghost_batch_norm_normalises_each_virtual_batch_in_training():
    bn = GhostBatchNorm(3, virtual=4, momentum=0.1, eps=1e-5)
    x = torch.randn(8, 3) + torch.tensor([0.0] * 4 + [10.0] * 4)[:, None]
    out = bn(x)
    for chunk in (out[:4], out[4:]):
        assert torch.allclose(chunk.mean(0), torch.zeros(3), atol=1e-5)
    whole = GhostBatchNorm(3, virtual=None, momentum=0.1, eps=1e-5)(x)
    assert not torch.allclose(whole[:4].mean(0), torch.zeros(3), atol=1e-2)


def test_tabnet_adds_its_sparsity_loss():
    _, model = model_of(SECTIONS["tabnet"][0] | {"sparsity": 0.5})
    model(batch())
    assert model.combiner.loss is not None and model.combiner.loss > 0
    _, plain = model_of(SECTIONS["tabnet"][0] | {"sparsity": 0.0})
    plain(batch())
    assert plain.combiner.loss is None


@pytest.mark.parametrize("mode", ["entmax15", "constant", "adaptive"])
def test_tabnet_takes_each_entmax_mode(mode):
    _, model = model_of(SECTIONS["tabnet"][0] | {"entmax_mode": mode, "entmax_alpha": 1.3})
    model(batch())["y"].sum().backward()
    if mode == "adaptive":
        assert model.combiner.attention[0].alpha.grad is not None


def test_the_comparator_compares_the_two_entities():
    _, model = model_of(SECTIONS["comparator"][0])
    model.eval()
    b = batch()
    comb = model.combiner
    with torch.no_grad():
        parts = [model.embeddings["a"](b["a"]), model.embeddings["c"](b["c"]), model.embeddings["b"](b["b"]),
                 model.embeddings["t"].steps(b["t"])[0]]
        out = comb(parts)
        e1 = comb.fc1(torch.cat([parts[0], parts[1]], 1))
        e2 = comb.fc2(torch.cat([parts[2], parts[3].reshape(6, -1)], 1))
    assert torch.allclose(out[:, :1], (e1 * e2).sum(1, keepdim=True), atol=1e-5)
    assert torch.allclose(out[:, 1:9], e1 * e2) and torch.allclose(out[:, 9:17], (e1 - e2).abs())
    assert torch.allclose(out[:, 17:], ((e1 @ comb.bilinear) * e2).sum(1, keepdim=True), atol=1e-5)


def test_a_comparator_without_layers_compares_the_inputs_themselves():
    """Ludwig's documented ``num_fc_layers: 0``: the entities' concatenated inputs compared
    (Ludwig's empty FCStack); entities of different widths are an error naming the fix."""
    inputs = [{"name": "a", "type": "number"}, {"name": "b", "type": "number"}]
    _, model = model_of({"type": "comparator", "entity_1": ["a"], "entity_2": ["b"], "num_fc_layers": 0}, inputs)
    model.eval()
    b = batch()
    with torch.no_grad():
        a, c = model.embeddings["a"](b["a"]), model.embeddings["b"](b["a"] * 2)
        out = model.combiner([a, c])
    assert torch.allclose(out[:, 1:2], a * c) and torch.allclose(out[:, 2:3], (a - c).abs())
    wide = [{"name": "a", "type": "number"}, {"name": "c", "type": "category"}]
    with pytest.raises(ConfigError, match="they must be as wide: give fc_layers"):
        model_of({"type": "comparator", "entity_1": ["a"], "entity_2": ["c"], "num_fc_layers": 0}, wide)


def test_the_hypernetwork_s_first_input_generates_the_matrix_that_reads_the_others():
    # Ludwig's defaults: no layers, so the output is the projections (4 each), the first as it is
    cfg, model = model_of({"type": "hypernetwork", "hidden_size": 4, "hyper_hidden_size": 8}, INPUTS[:3])
    assert cfg.combiner.fc_layers == [] and model.combiner.width == 3 * 4
    module = model.combiner
    x = [torch.randn(5, p.in_features) for p in module.projectors]
    out = module(x)
    assert torch.equal(out[:, :4], module.projectors[0](x[0]))
    # the others' part is linear in their projection, by a matrix only the first input sets
    with torch.no_grad():
        for p in module.projectors[1:]:
            p.bias.zero_()
    twice = module([x[0], 2 * x[1], 2 * x[2]])
    torch.testing.assert_close(twice[:, 4:], 2 * module(x)[:, 4:])
    other = module([x[0] + 1, x[1], x[2]])
    assert not torch.allclose(other[:, 4:], module(x)[:, 4:])  # another condition, another reading


def test_sequence_concat_tiles_the_vectors_over_the_main_sequence_s_steps():
    _, model = model_of({"type": "sequence_concat"})
    model.eval()
    b = batch()
    comb = model.combiner
    with torch.no_grad():
        steps = model.embeddings["t"].steps(b["t"])[0]
        vectors = [model.embeddings[n](b[n]) for n in ("a", "c", "b")]
        h = comb.concatenated([vectors[0], vectors[1], vectors[2], steps])
    assert h.shape == (6, LENGTH, 8 + 1 + vectors[1].shape[1] + 1)
    assert torch.equal(h[1, :, :8], steps[1])  # a full row: every step kept
    assert torch.equal(h[1, 3, 8:9], vectors[0][1])  # a's value at each step
    assert (h[0, 4:] == 0).all() and (h[0, :4, 8:9] == vectors[0][0]).all()  # a padded row: zeros after its last token


@pytest.mark.parametrize(
    ("combiner", "line"),
    [
        ({"type": "tabnet", "sise": 3}, "combiner.sise: unknown key; check the spelling against the documented settings; did you mean 'size'?"),
        ({"type": "tabnett"}, "combiner.type: the tabnett combiner is not available; raylight's combiners: concat, transformer, "
         "tabtransformer, ft_transformer, project_aggregate, tabnet, comparator, sequence_concat, sequence, hypernetwork; "),
        ({"type": "tabnett"}, "did you mean 'tabnet'?"),
        ({"type": "tabnet", "entmax_mode": "softmax"}, "combiner.entmax_mode: Input should be 'sparsemax', 'entmax15', 'constant' or 'adaptive'"),
        ({"type": "tabnet", "num_shared_blocks": 5}, "num_shared_blocks 5 is more than num_total_blocks 4"),
        ({"type": "transformer", "fc_dropuot": 0.1}, "combiner.fc_dropuot: unknown key; check the spelling against the documented settings; did you mean 'fc_dropout'?"),
        ({"type": "ft_transformer", "hidden_size": 10, "num_heads": 3}, "combiner: hidden_size 10 is not a multiple of num_heads 3"),
        ({"type": "tabtransformer", "embed_input_feature_name": 300}, "embed_input_feature_name 300 must be a number of units from 1 to hidden_size - 1 (255)"),
        ({"type": "comparator", "entity_1": ["a"]}, "combiner.entity_2: Field required"),
        ({"type": "comparator", "entity_1": ["a"], "entity_2": ["x"]}, "combiner.entity_2: ['x'] are not input features; use names of ['a', 't']"),
        ({"type": "comparator", "entity_1": ["a"], "entity_2": ["a"]}, "  combiner: inputs ['t'] are in neither entity_1 nor entity_2; add each to one of them"),
        ({"type": "sequence_concat"}, "  combiner: a sequence combiner needs an input with an output per step: give a sequence, text or timeseries input"),
        ({"type": "sequence", "main_sequence_feature": "a"}, "combiner.main_sequence_feature: 'a' gives one vector; give its encoder reduce_output: null"),
        ({"type": "sequence", "encoder": {"type": "embed"}}, "combiner.encoder: type: embed gives one vector, not one per step"),
        ({"type": "sequence", "reduce_output": "attention"}, "combiner.reduce_output: Input should be 'sum', 'mean', 'avg', 'max' or 'last'"),
    ],
)
def test_a_bad_combiner_setting_names_its_key_and_the_fix(combiner, line):
    data = {"input_features": [{"name": "a", "type": "number"}, {"name": "t", "type": "text"}],
            "output_features": [{"name": "y", "type": "binary"}], "combiner": combiner}
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    assert line in str(err.value)


def test_concat_refuses_an_output_per_step():
    with pytest.raises(ConfigError, match=r"combiner.type: concat concatenates one vector per input, and \['t'\] give their outputs per step"):
        validate_config({"input_features": INPUTS, "output_features": [{"name": "y", "type": "binary"}], "combiner": {"type": "concat"}})


@pytest.mark.parametrize(("inputs", "kind"), [(1, "concat"), (2, "concat"), (3, "ft_transformer"), (10, "ft_transformer")])
def test_with_no_combiner_section_the_combiner_is_ludwig_s_default_for_that_many_inputs(inputs, kind):
    # Ludwig 0.17 (ModelConfig.from_dict): ft_transformer for 3 or more inputs, else concat
    data = {"input_features": [{"name": f"x{i}", "type": "number"} for i in range(inputs)],
            "output_features": [{"name": "y", "type": "binary"}]}
    cfg = validate_config(data)
    assert cfg.combiner.type == kind
    assert ModelConfig.model_validate(cfg.model_dump(mode="json")).combiner == cfg.combiner  # a saved config keeps it
    # a section, even one without a type, is the config's own choice: concat
    assert validate_config({**data, "combiner": {}}).combiner.type == "concat"
    assert validate_config({**data, "combiner": {"type": "concat"}}).combiner.type == "concat"


def test_unequal_steps_of_two_sequences_are_an_error_naming_both():
    other = {**INPUTS[3], "name": "u", "preprocessing": {"max_sequence_length": LENGTH + 2}}
    with pytest.raises(ConfigError, match=r"input 'u' gives 9 steps and the main sequence 't' 7"):
        model_of({"type": "sequence_concat"}, [*INPUTS, other])


@pytest.mark.parametrize(
    "combiner",
    [
        # the batch norms' running statistics catch up in a few epochs (Ludwig's bn_momentum 0.05 takes more)
        "{type: tabnet, size: 8, output_size: 16, num_steps: 1, num_total_blocks: 2, num_shared_blocks: 1, bn_momentum: 0.3}",
        "{type: ft_transformer, hidden_size: 16, num_heads: 2, num_fc_layers: 1, output_size: 16}",
        "{type: sequence_concat, reduce_output: sum}",
    ],
    ids=["tabnet", "ft_transformer", "sequence_concat"],
)
def test_a_ludwig_combiner_trains_and_predicts_end_to_end(tmp_path, combiner):
    config = CONFIG.replace("epochs: 6", "epochs: 4").replace("learning_rate: auto", "learning_rate: 0.01").replace(
        "combiner: {type: concat, fc_layers: [{output_size: 32}], dropout: 0.1}", f"combiner: {combiner}"
    ).replace(
        "  - {name: review, type: text}",
        "  - {name: review, type: text, encoder: {type: rnn, reduce_output: null, state_size: 8, embedding_size: 8}}",
    )
    cfg, data = write(tmp_path, config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert out["evaluation"]["test"]["accuracy"] > 0.6
    model = load_model(str(tmp_path / "run" / "model"))
    assert model.config.combiner.type == combiner.split(",")[0].split()[-1]
    assert len(model.predict(frame(7, seed=3))) == 7
