"""Declarative runs that survive: a worker killed mid-run (the run restarts from its last
checkpoint, backend.trainer.max_failures), a driver killed mid-run (`raylight train
--resume` continues it). Both end as the uninterrupted run does, epoch by epoch: the
data position of a restart is exact (no sample trained twice or skipped)."""

from __future__ import annotations

import json
import logging
import math
import signal
import subprocess
import sys
import time

import pytest

from raylight.base.exceptions import WorkerDiedError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.conftest import REPO
from tests.declarative_data import CONFIG, write
from tests.driver.test_processes import session_env
from tests.helpers import wait_until
from tests.support import declarative_hooks as hooks

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300), pytest.mark.slow]

# Two workers of one CPU, preprocessing in the driver, a fixed batch; no dropout, so that
# a restart's numbers are the uninterrupted run's (the workers' random state is not
# checkpointed), and no early stop.
SURVIVE = CONFIG.replace(
    "backend: {type: local}",
    "backend: {type: ray, processor: {type: pandas}, trainer: {num_workers: 2, resources_per_worker: {CPU: 1}}}",
).replace("dropout: 0.1", "dropout: 0.0").replace("early_stop: 5", "early_stop: -1")


def rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_epochs(run, reference) -> None:
    """Every epoch once, in order, with the uninterrupted run's losses."""
    got, want = rows(run), rows(reference)
    assert [r["epoch"] for r in got] == [r["epoch"] for r in want] == list(range(6))
    for a, b in zip(got, want, strict=True):
        for key in ("train_loss", "validation_loss"):
            assert math.isclose(a[key], b[key], rel_tol=1e-5), (a["epoch"], key, a[key], b[key])


@pytest.fixture(scope="module")
def reference(ray_session, tmp_path_factory):
    """The uninterrupted run."""
    tmp = tmp_path_factory.mktemp("reference")
    cfg, data = write(tmp, config=SURVIVE)
    api.train(load_config(cfg), data, output_directory=str(tmp / "run"), progress=False)
    return tmp / "run"


def test_a_worker_killed_mid_run_restarts_the_run_which_ends_as_the_uninterrupted_one(
    ray_cluster, reference, tmp_path, monkeypatch, caplog
):
    """The default backend.trainer.max_failures restarts the run from its last checkpoint;
    with 0 the death ends the run, and the advice names backend.trainer.max_failures."""
    cfg, data = write(tmp_path, config=SURVIVE)
    marker = tmp_path / "killed"
    monkeypatch.setattr(
        "raylight.declarative.train.declarative_loop",
        hooks.functools.partial(hooks.killing_loop, marker=str(marker), after_epoch=1),
    )
    with caplog.at_level(logging.WARNING, logger="raylight"):
        out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert marker.exists(), "rank 1 killed itself after its report of epoch 1"
    assert "died" in caplog.text and "restarting from checkpoint" in caplog.text, caplog.text
    assert out["evaluation"]["epochs_run"] == 6
    assert_same_epochs(tmp_path / "run", reference)

    again = tmp_path / "killed-again"
    monkeypatch.setattr(
        "raylight.declarative.train.declarative_loop",
        hooks.functools.partial(hooks.killing_loop, marker=str(again), after_epoch=1),
    )
    with pytest.raises(WorkerDiedError) as info:
        api.train(load_config(cfg, ["backend.trainer.max_failures=0"]), data,
                  output_directory=str(tmp_path / "no-restarts"), progress=False)
    text = str(info.value)
    assert "backend.trainer.max_failures=0 allows 0 restart(s); raise backend.trainer.max_failures" in text, text
    assert "FailureConfig" not in text and "fit(" not in text


def test_raylight_train_resume_continues_a_sigkilled_driver_s_run_at_its_exact_data_position(
    ray_cluster, reference, tmp_path
):
    """SIGKILL `raylight train`'s driver while epoch 3 runs (checkpoint 2 committed): the
    same command is refused, saying to pass --resume; with --resume it trains epochs 3-5
    only, and every epoch's numbers are the uninterrupted run's."""
    cfg, data = write(tmp_path, config=SURVIVE)
    out = tmp_path / "run"
    command = ["train", "--config", cfg, "--dataset", data, "--output-directory", str(out), "--backend", "ray", "--quiet"]
    env = session_env(ray_cluster)
    first = subprocess.Popen(
        [sys.executable, "-m", "tests.support.declarative_hooks", str(tmp_path / "blocked"), "2", *command],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_until((out / "checkpoints" / "checkpoint_000002" / "meta.json").exists, 180, "checkpoint 2", first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    killed_at = time.time()
    assert [r["epoch"] for r in rows(out)] == [0, 1, 2]
    cli = [sys.executable, "-m", "raylight.cli"]
    refused = subprocess.run([*cli, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "pass --resume to continue it from there" in " ".join(refused.stderr.split()), refused.stderr
    resumed = subprocess.run([*cli, *command, "--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    got = rows(out)
    assert [r["_time"] < killed_at for r in got] == [True] * 3 + [False] * 3, "epochs 0-2 were the first driver's"
    assert_same_epochs(out, reference)
    assert (out / "model" / "weights.safetensors").exists() and (out / "evaluation.json").exists()
