"""Ludwig 0.17's keys as raylight reads them: every problem of a config reported at once,
at Ludwig's key paths; the keys it maps (optimizer.lr, an output's decoder layers), those
it ignores with a warning line, and those it refuses with the reason. No Ray."""

import logging

import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative.config.model import COMBINER_TYPES, ModelConfig
from raylight.declarative.ludwig.errors import key_path
from raylight.declarative.models.ecd import build_model
from raylight.declarative.suggest import validate_config
from raylight.declarative.train import OPTIMIZERS

BASE = {
    "input_features": [{"name": "a", "type": "number"}, {"name": "c", "type": "category"}],
    "output_features": [{"name": "y", "type": "category"}],
}


def problems(data):
    """The key paths of the lines of ``data``'s ConfigError."""
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    lines = str(err.value).splitlines()[1:]
    return {ln.strip().split(":")[0]: ln for ln in lines}


def test_every_problem_of_a_config_is_reported_at_once():
    """A Ludwig key raylight refuses, a misspelt key and a bad value: three lines of one
    error (not three rounds of fixing), each at its key path with what to do."""
    data = {
        **BASE,
        "input_features": [{"name": "a", "type": "number", "preprocesing": {}}, {"name": "c", "type": "category"}],
        "trainer": {"compile": True, "batch_size": -3},
    }
    found = problems(data)
    assert set(found) == {"trainer.compile", "input_features.0.preprocesing", "trainer.batch_size"}, found
    assert "torch.compile is not available" in found["trainer.compile"]
    assert "did you mean 'preprocessing'" in found["input_features.0.preprocesing"]
    assert "must be between 1" in found["trainer.batch_size"]


def test_key_paths_are_ludwig_s_without_the_unions_tags():
    """pydantic's tagged unions put the member's name in the location
    (``input_features.0.category.encoder``); the error names Ludwig's key path."""
    data = {
        **BASE,
        "input_features": [{"type": "number"}, {"name": "c", "type": "category", "encoder": {"embedding_size": 0}}],
        "hyperopt": {
            "goal": "minimize", "metric": "loss", "output_feature": "y",
            "parameters": {"trainer.learning_rate": {"space": "loguniform", "lower": 0, "upper": 1}},
        },
    }
    found = problems(data)
    assert {"input_features.0.name", "input_features.1.encoder.embedding_size", "hyperopt.parameters.trainer.learning_rate.lower"} <= set(found), found
    for path in found:
        assert not {"number", "category", "loguniform"} & set(path.split(".")), path
    # the walk itself: a tag goes, a missing key stays, a union member's name past a value goes
    loc = ("input_features", 0, "number", "name")
    assert key_path(loc, {"input_features": [{"type": "number"}]}) == ("input_features", 0, "name")
    assert key_path(("trainer", "batch_size", "int"), {"trainer": {"batch_size": "x"}}) == ("trainer", "batch_size")


def test_a_combiner_raylight_lacks_is_refused_with_the_ones_it_has():
    for kind in ("gated_fusion", "perceiver", "tab_transformer"):
        found = problems({**BASE, "combiner": {"type": kind, "num_layers": 2}})
        assert set(found) == {"combiner.type"}, found  # the section's own keys are not reported one by one
        assert f"{kind} combiner is not available; raylight's combiners: {', '.join(COMBINER_TYPES)}" in found["combiner.type"]
    assert "Ludwig's gated_fusion" in problems({**BASE, "combiner": {"type": "gated_fusion"}})["combiner.type"]
    # Not Ludwig's spelling (its type is tabtransformer, which raylight has): a misspelling.
    misspelt = problems({**BASE, "combiner": {"type": "tab_transformer"}})["combiner.type"]
    assert "the tab_transformer combiner" in misspelt and "did you mean 'tabtransformer'?" in misspelt


def test_keys_ludwig_documents_and_raylight_has_no_meaning_for_are_ignored_with_one_line_each(caplog):
    """backend.processor.parallelism (Ludwig's Ray test configs), the test helpers' encoder
    vocab_size / max_len, a decoder's vocab_size, learning_rate_scheduler.type (which
    Ludwig 0.17's schema drops too): the config loads, each said once."""
    data = {
        "input_features": [{"name": "t", "type": "text", "encoder": {"type": "embed", "vocab_size": 5, "max_len": 7}}],
        "output_features": [{"name": "y", "type": "category", "decoder": {"type": "classifier", "vocab_size": 10}}],
        "trainer": {"learning_rate_scheduler": {"type": "cosine"}},
        "backend": {"type": "ray", "processor": {"type": "dask", "parallelism": 2}},
    }
    with caplog.at_level(logging.WARNING, logger="raylight.declarative.ludwig.check"):
        cfg = validate_config(data)
    assert cfg.backend.processor.type == "dask" and cfg.trainer.learning_rate_scheduler is not None
    assert cfg.trainer.learning_rate_scheduler.decay is None  # Ludwig's too: the type means nothing
    said = [r.getMessage() for r in caplog.records]
    for path in ("backend.processor.parallelism", "input_features.0.encoder.vocab_size", "input_features.0.encoder.max_len",
                 "output_features.0.decoder.vocab_size", "trainer.learning_rate_scheduler.type"):
        assert sum(f"ignored Ludwig key {path}:" in line for line in said) == 1, (path, said)


def test_optimizer_lr_is_the_learning_rate_and_radam_is_torch_s():
    cfg = validate_config({**BASE, "trainer": {"optimizer": {"type": "radam", "lr": 0.003, "betas": [0.8, 0.99]}}})
    assert cfg.trainer.learning_rate == 0.003 and cfg.trainer.optimizer.type == "radam"
    opt = OPTIMIZERS["radam"]([torch.nn.Parameter(torch.zeros(2))], lr=0.003, **cfg.trainer.optimizer.kwargs())
    assert isinstance(opt, torch.optim.RAdam) and opt.param_groups[0]["betas"] == (0.8, 0.99)
    same = validate_config({**BASE, "trainer": {"learning_rate": 0.003, "optimizer": {"lr": 0.003}}})
    assert same.trainer.learning_rate == 0.003
    found = problems({**BASE, "trainer": {"learning_rate": 0.01, "optimizer": {"lr": 0.003}}})
    assert "trainer.learning_rate gives too (0.01); keep one" in found["trainer.optimizer.lr"]


def test_ludwig_s_other_optimizers_are_refused_with_the_reason_and_lbfgs_s_limits_are_said():
    assert "bitsandbytes" in problems({**BASE, "trainer": {"optimizer": {"type": "adam_8bit"}}})["trainer.optimizer.type"]
    assert "lbfgs" in problems({**BASE, "trainer": {"optimizer": {"type": "soap"}}})["trainer.optimizer.type"]
    cfg = validate_config({**BASE, "trainer": {"optimizer": {"type": "lbfgs", "max_iter": 20, "history_size": 10}}})
    assert cfg.trainer.optimizer.kwargs() == {"max_iter": 20, "history_size": 10}  # no weight_decay: LBFGS has none
    for trainer, words in (
        ({"batch_size": "auto", "optimizer": {"type": "lbfgs"}}, "give batch_size a number"),
        ({"optimizer": {"type": "lbfgs", "weight_decay": 0.1}}, "regularization_lambda"),
        ({"optimizer": {"type": "lbfgs", "betas": [0.9, 0.99]}}, "not of lbfgs"),
    ):
        found = problems({**BASE, "trainer": trainer})
        assert any(words in line for line in found.values()), found


def test_an_output_s_decoder_layers_are_built_between_the_combiner_and_its_linear_layer():
    """Ludwig's decoder fc_layers / num_fc_layers / fc_output_size, and the same keys on the
    output itself (Ludwig before 0.6, which its backward_compatibility moves)."""
    meta = {"a": {"mean": 0.0, "std": 1.0}, "c": {"vocab": ["<UNK>", "x", "y"]}, "y": {"classes": ["p", "q", "r"]}}
    for out in (
        {"name": "y", "type": "category", "decoder": {"num_fc_layers": 2, "fc_output_size": 8, "fc_activation": "tanh"}},
        {"name": "y", "type": "category", "num_fc_layers": 2, "output_size": 8, "activation": "tanh"},
        {"name": "y", "type": "category", "fc_layers": [{"output_size": 8}, {"output_size": 8}], "activation": "tanh"},
    ):
        cfg = validate_config({**BASE, "output_features": [out]})
        assert [fc.output_size for fc in cfg.output_features[0].decoder.fc_layers] == [8, 8], out
        decoder = build_model(cfg, meta).decoders["y"]
        linears = [m for m in decoder.modules() if isinstance(m, torch.nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears] == [(64, 8), (8, 8), (8, 3)], out
        assert any(isinstance(m, torch.nn.Tanh) for m in decoder.modules())
    plain = build_model(validate_config(BASE), meta).decoders["y"]
    assert isinstance(plain, torch.nn.Linear)  # no layers: the weights keep their names
    clash = problems({**BASE, "output_features": [{"name": "y", "type": "category", "output_size": 8, "decoder": {"fc_output_size": 16}}]})
    assert "keep one" in clash["output_features.0.output_size"]


def test_model_config_itself_raises_one_validation_error():
    with pytest.raises(Exception) as err:
        ModelConfig.model_validate({**BASE, "trainer": {"compile": True, "epochs": 0}})
    assert {tuple(e["loc"]) for e in err.value.errors()} == {("trainer", "compile"), ("trainer", "epochs")}


def test_a_key_of_ludwig_s_schema_raylight_does_not_take_is_told_as_ludwig_s():
    """Not "unknown key; check the spelling": a key Ludwig 0.17 documents for the section
    (of another type or encoder) says so; a misspelling still gets the spelling meant."""
    data = {
        "input_features": [{"name": "a", "type": "number", "preprocessing": {"window_size": 3, "normalisation": "zscore"}}],
        "output_features": [{"name": "y", "type": "number", "decoder": {"beam_width": 3}}],
    }
    found = problems(data)
    for path in ("input_features.0.preprocessing.window_size", "output_features.0.decoder.beam_width"):
        assert "a key of Ludwig 0.17's schema" in found[path] and "remove it" in found[path], found[path]
    assert "did you mean 'normalization'" in found["input_features.0.preprocessing.normalisation"]


def test_an_output_s_setting_of_another_type_comes_with_its_other_problems():
    out = {"name": "y", "type": "number", "threshold": 0.2, "top_k": 2, "loss_weight": -1}
    found = problems({**BASE, "output_features": [out]})
    assert set(found) == {"output_features.0.threshold", "output_features.0.top_k", "output_features.0.loss_weight"}, found
    assert "a binary or set or anomaly output's setting; a number output has none" in found["output_features.0.threshold"]


def test_an_encoder_named_on_the_input_takes_the_input_s_other_keys_as_ludwig_before_0_6():
    """Ludwig's examples (mnist) write ``encoder: stacked_cnn`` with its settings on the
    input; Ludwig 0.17 moves them into the encoder section, and so does raylight."""
    data = {**BASE, "input_features": [{
        "name": "img", "type": "image", "preprocessing": {"height": 8, "width": 8, "num_channels": 1},
        "encoder": "stacked_cnn", "conv_layers": [{"out_channels": 4, "kernel_size": 3}], "fc_layers": [{"output_size": 8}],
    }]}
    encoder = validate_config(data).input_features[0].encoder
    assert encoder.type == "stacked_cnn"
    assert [c.out_channels for c in encoder.conv_layers] == [4] and [f.output_size for f in encoder.fc_layers] == [8]
    # A key the encoder lacks is reported inside the encoder section, where it went.
    bad = {**data, "input_features": [{**data["input_features"][0], "num_filters": 4}]}
    assert "input_features.0.encoder.num_filters" in problems(bad)


def test_a_conv_layer_s_old_names_are_ludwig_0_17_s_and_use_pretrained_false_needs_no_weights():
    """Ludwig's mnist example writes a conv layer's num_filters / filter_size / pool_size
    (Ludwig 0.17: out_channels / kernel_size / pool_kernel_size); both names at once stays
    a problem. ``use_pretrained: false`` on a stacked_cnn (no weights) loads; true does not,
    and a resnet keeps its false (its default is true)."""
    image = {"name": "img", "type": "image", "preprocessing": {"height": 8, "width": 8, "num_channels": 1}}
    layer = {"num_filters": 4, "filter_size": 3, "pool_size": 2}
    data = {**BASE, "input_features": [{**image, "encoder": {"type": "stacked_cnn", "use_pretrained": False, "conv_layers": [layer]}}]}
    conv = validate_config(data).input_features[0].encoder.conv_layers[0]
    assert (conv.out_channels, conv.kernel_size, conv.pool_kernel_size) == (4, 3, 2)
    both = {**BASE, "input_features": [{**image, "encoder": {"type": "stacked_cnn", "conv_layers": [{**layer, "out_channels": 8}]}}]}
    assert "input_features.0.encoder.conv_layers.0.num_filters" in problems(both)
    pretrained = {**BASE, "input_features": [{**image, "encoder": {"type": "stacked_cnn", "use_pretrained": True}}]}
    assert "input_features.0.encoder.use_pretrained" in problems(pretrained)
    resnet = {**BASE, "input_features": [{**image, "encoder": {"type": "resnet", "model_variant": 18, "use_pretrained": False}}]}
    assert validate_config(resnet).input_features[0].encoder.use_pretrained is False


def test_keys_ludwig_0_17_drops_are_ignored_with_a_line(caplog):
    """tabnet's bn_virtual_divider and an output's weight_regularization (Ludwig's
    TensorFlow-era keys, which Ludwig 0.17's schema drops) load, each said in one line."""
    data = {**BASE, "combiner": {"type": "tabnet", "bn_virtual_divider": 32},
            "output_features": [{"name": "y", "type": "category", "weight_regularization": None}]}
    with caplog.at_level(logging.WARNING):
        validate_config(data)
    said = caplog.text
    assert "combiner.bn_virtual_divider" in said and "output_features.0.weight_regularization" in said


def test_the_trainer_keys_of_ludwig_s_configs_issue_56(caplog):
    """Another encoder type's settings on a text or sequence encoder are dropped with one
    line naming them (Ludwig drops them); steps_per_checkpoint is ignored; Ludwig's optuna
    executor is search_alg optuna (its int space inclusive, as Optuna's); a dotted hyperopt
    metric gives the split and output; a category's sparse encoder is one-hot."""
    seq = {"name": "s", "type": "sequence", "encoder": {"type": "embed", "state_size": 8, "num_filters": 8, "embedding_size": 8}}
    with caplog.at_level(logging.WARNING, logger="raylight.declarative.ludwig.check"):
        cfg = validate_config({**BASE, "input_features": [*BASE["input_features"], seq], "trainer": {"steps_per_checkpoint": 1}})
    said = [r.getMessage() for r in caplog.records]
    assert any("input_features.2.encoder.{num_filters, state_size}" in line and "Ludwig ignores them too" in line for line in said), said
    assert any("trainer.steps_per_checkpoint" in line for line in said), said
    assert cfg.input_features[2].encoder.embedding_size == 8
    hyperopt = {
        "executor": {"type": "optuna", "num_samples": 4, "sampler": "auto", "pruner": "hyperband", "storage": "sqlite:///x.db"},
        "parameters": {"trainer.batch_size": {"space": "int", "lower": 16, "upper": 256}},
        "goal": "minimize", "metric": "validation.combined.loss", "split": "validation",
    }
    cfg = validate_config({**BASE, "hyperopt": hyperopt})
    h = cfg.hyperopt
    assert h.search_alg.type == "optuna" and h.executor.num_samples == 4
    assert (h.parameters["trainer.batch_size"].lower, h.parameters["trainer.batch_size"].upper) == (16, 257)
    assert (h.metric, h.output_feature, h.split) == ("loss", "combined", "validation")
    found = problems({**BASE, "hyperopt": {**hyperopt, "split": "test", "executor": {"type": "optuna", "sampler": "cmaes"}}})
    assert "make them agree" in found["hyperopt.metric"] and "TPE" in found["hyperopt.executor.sampler"], found
    sparse = validate_config({**BASE, "defaults": {"category": {"encoder": {"type": "sparse"}}}})
    model = build_model(sparse, {"a": {"mean": 0.0, "std": 1.0, "min": -1.0, "span": 2.0}, "c": {"vocab": ["<UNK>", "x", "y"]}, "y": {"classes": ["p", "q"]}})
    one_hot = model.embeddings["c"](torch.tensor([2, 0]))
    assert one_hot.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


def test_an_image_encoder_s_old_size_keys_are_its_preprocessing_s():
    """insurance_lite's vit: img_height / in_channels agreeing with the preprocessing (or
    with none) are dropped, one that disagrees is reported; the HF ViT's sizes are vit
    b_16's, another size is refused naming model_variant."""
    image = {"name": "i", "type": "image", "preprocessing": {"height": 32, "width": 32}, "encoder": "vit",
             "use_pretrained": False, "img_height": 32, "in_channels": 3, "hidden_size": 768}
    cfg = validate_config({**BASE, "input_features": [image]})
    assert cfg.input_features[0].encoder.type == "vit"
    found = problems({**BASE, "input_features": [{**image, "img_height": 64, "hidden_size": 512}]})
    assert set(found) == {"input_features.0.encoder.img_height", "input_features.0.encoder.hidden_size"}, found
    assert "model_variant" in found["input_features.0.encoder.hidden_size"]


def test_a_pretrained_image_encoder_is_refused_at_its_type_with_the_config_s_other_problems():
    with pytest.raises(ConfigError) as err:
        validate_config({
            "input_features": [{"name": "img", "type": "image", "encoder": {"type": "dinov2", "use_pretrained": True, "trainable": False}},
                               {"name": "pic", "type": "image", "encoder": {"type": "convnext", "use_pretrained": False}}],
            "output_features": [{"name": "y", "type": "category"}],
            "trainer": {"epochs": 0},
        })
    lines = {ln.strip().split(": ", 1)[0]: ln for ln in str(err.value).splitlines()[1:]}
    assert set(lines) == {"input_features.0.encoder.type", "input_features.1.encoder.type", "trainer.epochs"}, str(err.value)
    assert "use_pretrained: true cannot be satisfied offline" in lines["input_features.0.encoder.type"]
    assert "offline" not in lines["input_features.1.encoder.type"] and "no convnext to train from scratch" in lines["input_features.1.encoder.type"]
