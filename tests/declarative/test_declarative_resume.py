"""Declarative runs that survive: a worker killed mid-run (the run restarts from its last
checkpoint, backend.trainer.max_failures), a driver killed mid-run (`raylight train
--resume` continues it). Both end as the uninterrupted run does, epoch by epoch: the
data position of a restart is exact (no sample trained twice or skipped). And a search
whose driver is killed (`raylight hyperopt --resume` keeps its finished trials and
continues the others from their checkpoints)."""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from raylight.base.exceptions import WorkerDiedError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.conftest import REPO
from tests.declarative_data import CONFIG, write
from tests.driver.test_processes import _env, session_env
from tests.helpers import pid_alive, process_tree, wait_until
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


@pytest.mark.extended  # minutes; a SIGKILLed driver's resume runs in make test by test_processes.py::test_resume_after_the_driver_is_killed
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


# -- raylight hyperopt --resume -------------------------------------------------------
# A grid of two trials of one 1-CPU worker each, side by side on the embedded cluster's
# CPUs; the second (learning rate 0.02) blocks after its report of epoch 1 in the first
# driver (tests/support/hyperopt_hooks.py).
SEARCH = SURVIVE.replace("trainer: {num_workers: 2,", "trainer: {num_workers: 1,").replace("epochs: 6,", "epochs: 4,") + (
    "hyperopt:\n"
    "  goal: minimize\n"
    "  metric: loss\n"
    "  parameters: {trainer.learning_rate: {space: grid, values: [0.01, 0.02]}}\n"
    "  search_alg: {type: grid}\n"
    "  executor: {num_samples: 1, max_concurrent_trials: 2, scheduler: {type: fifo}}\n"
)
BLOCKED_LR, BLOCK_AFTER = 0.02, 1


def _experiment_state(experiment) -> dict[str, dict]:
    """Tune's saved view of each trial (its newest experiment_state file): trial id ->
    status and last result. What a restore starts from."""
    files = sorted(experiment.glob("experiment_state-*.json"))
    if not files:
        return {}
    try:
        state = json.loads(files[-1].read_text())
    except json.JSONDecodeError:  # Tune writes it in place: read it again at the next poll
        return {}
    trials = {}
    for trial_json, run_json in state["trial_data"]:
        trial, run = json.loads(trial_json), json.loads(run_json)
        trials[trial["trial_id"]] = {"status": trial["status"], "last": run.get("last_result") or {}}
    return trials


def _embedded_processes(driver_pid: int) -> list[int]:
    """The live processes of the embedded cluster ``driver_pid`` started: their environment
    carries its token, which begins with the driver's pid (driver/_reaper.py)."""
    from raylight.driver._reaper import EMBEDDED_ENV

    prefix = f"{EMBEDDED_ENV}={driver_pid}-".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if any(v.startswith(prefix) for v in f.read().split(b"\0")):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def _trial_rows(experiment) -> dict[float, list[dict]]:
    """Each trial's reports as Tune wrote them into its directory (result.json), by the
    trial's learning rate."""
    rows = {}
    for params in experiment.glob("*/params.json"):
        lines = (params.parent / "result.json").read_text().splitlines()
        rows[json.loads(params.read_text())["trainer.learning_rate"]] = [json.loads(line) for line in lines if line.strip()]
    return rows


@pytest.mark.beside
def test_raylight_hyperopt_resume_keeps_finished_trials_and_continues_the_others_from_their_checkpoint(tmp_path):
    """SIGKILL `raylight hyperopt`'s driver (its embedded Ray with it) once one trial has
    finished and Tune's saved state holds the other mid-way, at its checkpoint of epoch 1:
    nothing of that Ray is left; `raylight hyperopt ... --resume` keeps the finished trial
    (same id, its reports, not run again), the other trains epochs 2-3 only, and the
    results hold both."""
    cfg, data = write(tmp_path, config=SEARCH)
    out = tmp_path / "search"
    command = ["hyperopt", "--config", cfg, "--dataset", data, "--output-directory", str(out), "--quiet"]
    ray_tmp = tempfile.mkdtemp(prefix="rl-hyp-", dir="/tmp")  # the drivers' embedded Ray's, short for its sockets
    env = {**_env(), "RAY_TMPDIR": ray_tmp}
    marker, log = tmp_path / "blocked", tmp_path / "first.log"
    experiment = out / "tune"
    with open(log, "w") as sink:
        first = subprocess.Popen(
            [sys.executable, "-m", "tests.support.hyperopt_hooks", str(marker), str(BLOCKED_LR), str(BLOCK_AFTER), *command],
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    seen: dict[int, None] = {}
    try:

        def mid_way() -> bool:
            seen.update(dict.fromkeys(process_tree(first.pid)))
            trials = _experiment_state(experiment)
            # a trial with no report yet has no epoch: -1 (None beside an int does not sort)
            statuses = sorted((t["status"], -1 if (e := t["last"].get("epoch")) is None else e) for t in trials.values())
            return marker.exists() and statuses == [("RUNNING", BLOCK_AFTER), ("TERMINATED", 3)]

        wait_until(mid_way, 240, "one trial finished and the other at epoch 1 in Tune's saved state", first)
        before = _experiment_state(experiment)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()}") from None
    finally:
        first.send_signal(signal.SIGKILL)  # the driver alone: its cluster must follow it by itself
        first.wait(30)
    killed_at = time.time()

    # Nothing of the killed driver's Ray is left: every process it started (seen while it
    # ran), every process of its cluster, and its session directory.
    def left() -> list[int]:
        return [p for p in [*seen, *_embedded_processes(first.pid)] if p != first.pid and pid_alive(p)]

    wait_until(lambda: not left(), 60, "the killed driver's Ray processes to exit")
    assert not list(pathlib.Path(ray_tmp).glob("ray/session_2*")), "the killed driver's session directory was left"

    rows_before = _trial_rows(experiment)
    assert [r["epoch"] for r in rows_before[0.01]] == [0, 1, 2, 3] and [r["epoch"] for r in rows_before[BLOCKED_LR]] == [0, 1]

    resumed = subprocess.run(
        [sys.executable, "-m", "raylight.cli", *command, "--resume"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    results = json.loads((out / "results.json").read_text())
    by_lr = {t["config.trainer.learning_rate"]: t for t in results["trials"]}
    assert set(by_lr) == {0.01, BLOCKED_LR}
    assert {t["trial"] for t in results["trials"]} == set(before), "the same trials, by id"
    assert [(by_lr[lr]["status"], by_lr[lr]["epochs"]) for lr in (0.01, BLOCKED_LR)] == [("COMPLETED", 4)] * 2, results
    rows_after = _trial_rows(experiment)
    # the finished trial was not run again: its reports are the first driver's, unchanged
    assert rows_after[0.01] == rows_before[0.01]
    assert by_lr[0.01]["history"] == [r[results["metric"]] for r in rows_before[0.01]]
    # the other continued from its checkpoint of epoch 1: epochs 2 and 3 only, trained now
    assert [(r["epoch"], r["timestamp"] < killed_at) for r in rows_after[BLOCKED_LR]] == [
        (0, True), (1, True), (2, False), (3, False)
    ], rows_after[BLOCKED_LR]
    assert rows_after[BLOCKED_LR][:2] == rows_before[BLOCKED_LR]
    assert (out / "best_config.yaml").exists() and (out / "hyperopt.png").exists()
    assert not list(pathlib.Path(ray_tmp).glob("ray/session_2*")), "the resumed driver's session directory was left"
    shutil.rmtree(ray_tmp)  # kept where the test failed, with the drivers' Ray logs
