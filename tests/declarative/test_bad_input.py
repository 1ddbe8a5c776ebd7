"""Bad and odd inputs whose check is pure driver logic (no Ray), beside the catalogue
(tests/adversarial.py) that runs whole commands."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.adversarial import Workspace

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.mark.parametrize("batch,expected", [(1000, 42), (42, 42), (16, 16)])
def test_a_batch_larger_than_the_training_split_is_clamped_and_said(tmp_path, caplog, batch, expected):
    ws = Workspace(str(tmp_path / "ws"))
    ws.edit("batch_size: 16", f"batch_size: {batch}")
    config = load_config(ws.cfg)
    prepared = api.prepare(config, ws.data, use_cache=False)
    assert len(next(iter(prepared.train.values()))) == 42  # 70% of 60 rows
    with caplog.at_level(logging.WARNING, logger="raylight"):
        loop_config, _ = api.loop_settings(config, prepared, on_ray=False)
    assert loop_config["batch_size"] == expected
    said = [r.getMessage() for r in caplog.records if "trainer.batch_size" in r.getMessage()]
    if batch > 42:
        assert said == [
            f"trainer.batch_size {batch} is larger than the 42 rows of the training split; training with "
            "batch_size 42 (the whole split each step). Set trainer.batch_size to at most 42 to choose it yourself"
        ]
    else:
        assert said == []


@pytest.fixture(scope="module")
def reference_model(tmp_path_factory):
    from tests.adversarial import train_reference_model

    return train_reference_model(str(tmp_path_factory.mktemp("reference")))


_SPY = """
import sys
import importlib
m = importlib.import_module("raylight.cli.main")
real = m._fail
def spy(exc):
    print("torch imported at the error:", "torch" in sys.modules, file=sys.stderr)
    real(exc)
m._fail = spy
sys.argv = ["raylight", *sys.argv[1:]]
m.main()
"""


def _truncate(path):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


BROKEN_MODELS = {
    "no-model-json": (lambda d: os.remove(os.path.join(d, "model.json")), "no model.json"),
    "model-json-garbage": (lambda d: _write(os.path.join(d, "model.json"), b"{nope"), "not valid JSON"),
    "model-json-future": (lambda d: _edit(d, lambda m: m.update(format=99)), "format 99"),
    "model-json-bad-config": (lambda d: _edit(d, lambda m: m["config"]["trainer"].update(epochs=-1)), "trainer.epochs"),
    "weights-missing": (lambda d: os.remove(os.path.join(d, "weights.safetensors")), "is missing"),
    "weights-truncated": (lambda d: _truncate(os.path.join(d, "weights.safetensors")), "cannot be read"),
    "weights-garbage": (lambda d: _write(os.path.join(d, "weights.safetensors"), os.urandom(300)), "cannot be read"),
    "weights-empty": (lambda d: _write(os.path.join(d, "weights.safetensors"), b""), "cannot be read"),
}


def _edit(model_dir, change):
    path = os.path.join(model_dir, "model.json")
    with open(path) as f:
        saved = json.load(f)
    change(saved)
    with open(path, "w") as f:
        json.dump(saved, f)


@pytest.mark.parametrize("command", ["predict", "evaluate"])
@pytest.mark.parametrize("damage", sorted(BROKEN_MODELS))
def test_a_broken_model_directory_is_named_before_torch_is_imported(tmp_path, reference_model, command, damage):
    model = str(tmp_path / "model")
    shutil.copytree(reference_model, model)
    change, fragment = BROKEN_MODELS[damage]
    change(model)
    ws = Workspace(str(tmp_path / "ws"))
    res = subprocess.run(
        [sys.executable, "-c", _SPY, command, "--model-path", model, "--dataset", ws.data],
        capture_output=True, text=True, timeout=120,
    )
    text = " ".join(res.stderr.split())
    assert res.returncode == 2, res.stderr
    assert fragment in text and model in text, res.stderr
    assert "torch imported at the error: False" in text, res.stderr


def test_the_deepspeed_keys_raylight_and_its_users_write_are_known():
    """The check reads DeepSpeed's own schema: what raylight writes into the engine's
    config (engine_config) and common users' settings pass; a typo does not."""
    from raylight.config.schema import DEEPSPEED_BATCH_KEYS, ZERO_SIZES
    from raylight.worker.strategies.deepspeed_keys import check_keys

    check_keys({
        **{k: "auto" for k in DEEPSPEED_BATCH_KEYS},
        "gradient_clipping": 1.0, "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "managed_gradient_accumulation": False, "bf16": {"enabled": False}, "steps_per_print": 10,
        "wall_clock_breakdown": False, "activation_checkpointing": {}, "tensorboard": {"enabled": False},
        "zero_optimization": {
            **{k: 1000 for k in ZERO_SIZES}, "stage": 3, "overlap_comm": True, "contiguous_gradients": True,
            "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu"},
        },
    })
    with pytest.raises(ValueError, match=r"config zero_optimization\.overlap_com: unknown DeepSpeed key .* did you mean 'overlap_comm'\?"):
        check_keys({"zero_optimization": {"overlap_com": True}})


@pytest.mark.parametrize("workers", [1, 2])
def test_fsdp_blocks_naming_no_module_of_the_model_are_refused_in_the_driver(tmp_path, monkeypatch, workers):
    """The declarative model is built in the driver on the meta device and checked before
    the core's Trainer starts anything (the local backend's process, Ray's workers)."""
    from raylight.base.exceptions import ConfigError
    from raylight.driver.trainer import Trainer
    from tests.declarative_data import CONFIG, write

    def started(self):
        raise AssertionError("raylight.Trainer.fit ran: the mistake was left to the workers")

    monkeypatch.setattr(Trainer, "fit", started)
    backend = f"backend: {{type: local, trainer: {{num_workers: {workers}, strategy: {{type: fsdp, blocks: [TransformerBlock]}}}}}}"
    cfg, data = write(tmp_path, config=CONFIG.replace("backend: {type: local}", backend))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"backend.trainer.strategy.blocks \['TransformerBlock'\] names no submodule of .*; its submodule classes are \[.*'Linear'.*\]"):
        api.train(load_config(cfg), data, output_directory=str(out), progress=False)
    assert not out.exists()
