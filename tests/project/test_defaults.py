"""One home for each default several places apply: a named constant in one module, which
every other place imports (and --help and the config's descriptions show)."""

from __future__ import annotations

import inspect
import re

import pytest
import typer
from typer.testing import CliRunner

from raylight.cli import app
from raylight.config import FailureConfig, RunConfig, ScalingConfig, schema
from raylight.config.validation import validate

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]
FEATURES = {"input_features": [{"name": "x", "type": "number"}], "output_features": [{"name": "y", "type": "binary"}]}


def _command(*path: str):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def _default(path: tuple[str, ...], flag: str):
    return next(p.default for p in _command(*path).params if flag in p.opts)


def test_a_worker_s_resources_default_has_one_home(monkeypatch):
    from raylight.declarative.config.model import ModelConfig
    from raylight.declarative.hyperopt import trial_shape
    from raylight.tune.resources import get_tune_resources, trial_bundles

    assert ScalingConfig().worker_resources() == {"CPU": schema.WORKER_CPUS}
    assert ScalingConfig(use_gpu=True).worker_resources() == {"CPU": schema.WORKER_CPUS, "GPU": schema.WORKER_GPUS}
    assert _default(("run",), "--cpus") == schema.WORKER_CPUS
    for fn in (trial_bundles, get_tune_resources):
        assert inspect.signature(fn).parameters["cpus_per_worker"].default == schema.WORKER_CPUS
    # The places that fill the default in at run time read the one constant.
    from raylight.config import scaling  # the constants' home (config.schema re-exports them)

    monkeypatch.setattr(scaling, "WORKER_CPUS", 3.0)
    monkeypatch.setattr(scaling, "WORKER_GPUS", 0.5)
    assert ScalingConfig(use_gpu=True).worker_resources() == {"CPU": 3.0, "GPU": 0.5}
    assert trial_bundles(num_workers=1, cpus_per_worker=2.0, use_gpu=True)[1] == {"CPU": 2.0, "GPU": 0.5}
    config = validate(ModelConfig, {
        **FEATURES, "backend": {"trainer": {"use_gpu": True}},
        "hyperopt": {"parameters": {"trainer.learning_rate": {"space": "loguniform", "lower": 1e-4, "upper": 1e-1}}},
    })
    assert trial_shape(config).per_worker == {"CPU": 3.0, "GPU": 0.5}


def test_the_connect_timeout_has_one_home():
    """``raylight submit`` and ``raylight jobs ...`` wait as long as a run does for its
    address (they waited 10 s, runs 15 s)."""
    from raylight.driver.runtime import connect
    from raylight.jobs.submission import JobsClient

    assert FailureConfig().connect_timeout_s == schema.CONNECT_TIMEOUT_S
    assert inspect.signature(connect).parameters["connect_timeout_s"].default == schema.CONNECT_TIMEOUT_S
    assert inspect.signature(JobsClient).parameters["connect_timeout_s"].default == schema.CONNECT_TIMEOUT_S
    commands = [("submit",), ("jobs", "list"), ("jobs", "status"), ("jobs", "logs"), ("jobs", "stop")]
    assert {path: _default(path, "--connect-timeout") for path in commands} == dict.fromkeys(commands, schema.CONNECT_TIMEOUT_S)
    out = CliRunner().invoke(app, ["jobs", "list", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    line = next(line for line in out.output.splitlines() if "--connect-timeout" in line)
    assert re.search(rf"default: {schema.CONNECT_TIMEOUT_S:g}(\.0)?\b", line), line


def test_the_lease_timeout_has_one_home():
    from raylight.driver.recorder import RunRecorder

    assert RunConfig().lease_timeout_s == schema.LEASE_TIMEOUT_S
    assert inspect.signature(RunRecorder).parameters["lease_timeout_s"].default == schema.LEASE_TIMEOUT_S


def test_the_auto_batch_size_has_one_home(monkeypatch):
    from raylight.declarative import api
    from raylight.declarative.config.model import ModelConfig
    from raylight.declarative.config.trainer import AUTO_BATCH_SIZE, TrainerSection

    assert f"start at {AUTO_BATCH_SIZE} " in TrainerSection.model_fields["batch_size"].description
    config = validate(ModelConfig, {**FEATURES, "trainer": {"batch_size": "auto"}})
    prepared = api.Prepared(config=config, meta={}, train={}, validation={}, test=None, test_frame=None)
    monkeypatch.setattr(api, "AUTO_BATCH_SIZE", 48)
    loop_config, adaptive = api.loop_settings(config, prepared, on_ray=True)
    assert loop_config["batch_size"] == 48 and adaptive is not None
