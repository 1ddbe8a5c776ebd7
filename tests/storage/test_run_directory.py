"""Run directories: created when training starts, one writer, crash debris cleaned,
damage survived on resume, failures backed off."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import raylight.storage.run_dir as storage_mod
from raylight.base.exceptions import ConfigError, RunInUseError
from raylight.driver.controller import Controller, FailurePolicy, FixedScalingPolicy, State
from raylight.driver.recorder import RunRecorder, directory_state
from raylight.storage.checkpoint import Checkpoint, serialize_state
from raylight.storage.lease import RunLease
from raylight.storage.run_dir import RunStorage, check_state, replace_dir
from raylight.worker.protocol import GroupPoll, Report, WorkerFailure, WorkerPoll
from tests.conftest import REPO
from tests.driver.test_controller import FakeGroup


def _state(step: int) -> bytes:
    return serialize_state({"step": step, "w": torch.full((4,), float(step))})


def _recorder(path, keep: int = 2, **kw) -> RunRecorder:
    return RunRecorder(RunStorage(str(path)), checkpoints_to_keep=keep, **kw)


def _write(rec: RunRecorder, steps, checkpoint_every: int = 1) -> None:
    for step in steps:
        data = _state(step) if step % checkpoint_every == 0 else None
        rec.record(Report({"step": step}, data, time=float(step), seq=step), num_workers=1)


def _stopped_run(run, steps, keep: int = 2, failed: bool = True) -> None:
    """A run that reported ``steps`` (each with a checkpoint), then failed or finished."""
    rec = _recorder(run, keep=keep)
    rec.open({}, resume=False)
    _write(rec, steps)
    rec.close(RuntimeError("killed") if failed else None)


# -- the directory appears when training starts -----------------------------------------
def test_open_writes_nothing_and_begin_creates_the_run(tmp_path):
    run = tmp_path / "runs" / "r"
    rec = _recorder(run)
    rec.open({"a": 1}, resume=False)
    assert not (tmp_path / "runs").exists()
    rec.begin()
    assert json.loads((run / "config.json").read_text()) == {"a": 1}
    assert json.loads((run / "status.json").read_text())["state"] == "running"
    rec.close()
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert not (run / "lease.json").exists()


def test_an_attempt_that_failed_before_its_first_checkpoint_does_not_block_the_next(tmp_path, caplog):
    run = tmp_path / "r"
    first = _recorder(run)
    first.open({"attempt": 1}, resume=False)
    first.record(Report({"step": 0}), num_workers=1)  # a report, no checkpoint
    first.close(RuntimeError("placement failed"))
    assert json.loads((run / "status.json").read_text())["error"] == "RuntimeError: placement failed"
    assert directory_state(RunStorage(str(run))) == "replaceable"
    second = _recorder(run)
    second.open({"attempt": 2}, resume=False)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        _write(second, [0])
    second.close()
    assert "failed before committing a checkpoint" in caplog.text
    assert json.loads((run / "config.json").read_text()) == {"attempt": 2}
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0]


def test_other_files_in_the_directory_are_never_replaced(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        _recorder(run).open({}, resume=False)


# -- one writer -------------------------------------------------------------------------
def test_a_second_driver_is_refused_with_the_holder_named(tmp_path):
    run = tmp_path / "r"
    first = _recorder(run)
    first.open({}, resume=False)
    _write(first, [0, 1])
    second = _recorder(run)
    with pytest.raises(RunInUseError) as err:
        second.open({}, resume=True)
    text = str(err.value)
    assert f"pid {os.getpid()}" in text and "another driver" in text
    assert err.value.holder["pid"] == os.getpid()
    _write(first, [2])  # the holder is undisturbed
    first.close()
    assert second.open({}, resume=True).load()["step"] == 2
    second.close()


def test_a_killed_drivers_lease_ends_with_it(tmp_path):
    run = tmp_path / "r"
    code = (
        "import sys, time; from raylight.storage.lease import RunLease; from raylight.storage.run_dir import RunStorage;"
        f"lease = RunLease(RunStorage({str(run)!r}), timeout_s=60); lease.acquire();"
        "print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(RunInUseError, match=f"pid {proc.pid}"):
            RunLease(RunStorage(str(run)), timeout_s=60).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    lease = RunLease(RunStorage(str(run)), timeout_s=60)
    lease.acquire()  # at once: no timeout to wait out
    assert json.loads((run / "lease.json").read_text())["pid"] == os.getpid()
    lease.release()


def test_object_store_lease_times_out_and_the_old_holder_stops(tmp_path, caplog):
    storage = RunStorage(f"memory://rl-lease-{tmp_path.name}/r")
    now = [1000.0]
    old = RunLease(storage, timeout_s=60, clock=lambda: now[0])
    old.acquire()
    old._stop.set()  # its heartbeat thread stops: the holder froze
    new = RunLease(storage, timeout_s=60, clock=lambda: now[0])
    with pytest.raises(RunInUseError, match="lease_timeout_s=60s is taken over"):
        new.acquire()
    now[0] += 61
    with caplog.at_level(logging.WARNING, logger="raylight"):
        new.acquire()
    assert "silent for 61s" in caplog.text
    with pytest.raises(RunInUseError, match="lost run"):
        old.check(reread=True)
    old.release()  # leaves the new holder's lease alone
    assert json.loads(storage.read_text("lease.json"))["id"] == new.id
    new.release()
    assert not storage.exists("lease.json")


def test_a_recorder_that_lost_its_lease_writes_nothing_more(tmp_path):
    storage = RunStorage(f"memory://rl-lost-{tmp_path.name}/r")
    rec = RunRecorder(storage, checkpoints_to_keep=2, lease_timeout_s=60)
    rec.open({}, resume=False)
    _write(rec, [0])
    rec.lease._stop.set()
    thief = RunLease(storage, timeout_s=60, clock=lambda: time.time() + 120)
    thief.acquire()
    with pytest.raises(RunInUseError, match="lost run"):
        _write(rec, [1])
    rec.close(RuntimeError("lost"))
    assert json.loads(storage.read_text("status.json"))["state"] == "running"  # not ours to change
    assert [c.index for c in storage.list_checkpoints()] == [0]
    thief.release()


# -- crash debris and atomic commits ----------------------------------------------------
def test_debris_is_removed_at_the_next_open(tmp_path, caplog):
    run = tmp_path / "r"
    _stopped_run(run, [0, 1])
    ckpts = run / "checkpoints"
    (ckpts / ".tmp-checkpoint_000002-abc").mkdir()  # a commit cut short
    (ckpts / ".tmp-checkpoint_000002-abc" / "state.pt").write_bytes(b"x" * 1000)
    (ckpts / ".trash-checkpoint_000000-def").mkdir()  # a delete cut short
    (ckpts / "checkpoint_000005").mkdir()  # a directory without its commit marker
    (run / ".tmp-0123-config.json").write_text("{")  # an atomic file write cut short
    again = _recorder(run)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert again.open({}, resume=True).load()["step"] == 1
    assert sorted(os.listdir(ckpts)) == ["checkpoint_000000", "checkpoint_000001"]
    assert not [n for n in os.listdir(run) if n.startswith(".tmp-")]
    assert "checkpoints/.tmp-checkpoint_000002-abc" in caplog.text and "checkpoints/checkpoint_000005" in caplog.text
    again.close()


@pytest.mark.parametrize("exchange", [True, False])
def test_the_final_rename_replaces_an_existing_target_atomically(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(storage_mod, "_rename_exchange", lambda a, b: False)
    final, tmp = tmp_path / "checkpoint_000003", tmp_path / ".tmp-checkpoint_000003-x"
    final.mkdir()
    (final / "state.pt").write_text("old")
    tmp.mkdir()
    (tmp / "state.pt").write_text("new")
    replace_dir(str(tmp), str(final))
    assert (final / "state.pt").read_text() == "new"
    assert os.listdir(tmp_path) == ["checkpoint_000003"]


def test_a_commit_records_the_size_and_digest_of_its_state(tmp_path):
    storage = RunStorage(str(tmp_path))
    storage.commit_checkpoint(0, b"abc", {"index": 0})
    meta = storage.list_checkpoints()[0].meta
    assert meta["state_bytes"] == 3 and check_state(b"abc", meta) is None
    assert "has 2 bytes" in (check_state(b"ab", meta) or "")
    assert "SHA-256" in (check_state(b"abd", meta) or "")


def test_a_delete_cut_short_leaves_no_checkpoint_that_looks_committed(tmp_path, monkeypatch):
    storage = RunStorage(str(tmp_path))
    storage.commit_checkpoint(0, _state(0), {"index": 0})
    storage.commit_checkpoint(1, _state(1), {"index": 1})

    def die(path, *a, **k):
        raise KeyboardInterrupt  # the driver stops between the rename and the removal

    monkeypatch.setattr(storage_mod.shutil, "rmtree", die)
    with pytest.raises(KeyboardInterrupt):
        storage.delete_checkpoint(0)
    monkeypatch.undo()
    scan = storage.scan_checkpoints()
    assert [c.index for c in scan.committed] == [1] and len(scan.debris) == 1
    storage.clean_debris()
    assert os.listdir(tmp_path / "checkpoints") == ["checkpoint_000001"]


# -- resume survives damage -------------------------------------------------------------
def test_a_torn_last_metrics_line_is_dropped(tmp_path, caplog):
    run = tmp_path / "r"
    _stopped_run(run, [0, 1])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"_report": 2, "step": 2, "lo')  # the driver died mid-append
    again = _recorder(run)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        again.open({}, resume=True)
    assert "line 3 is torn" in caplog.text
    assert again.history == [{"step": 0}, {"step": 1}]
    _write(again, [2])
    again.close()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_a_damaged_line_inside_the_history_is_dropped_with_a_warning(tmp_path, caplog):
    run = tmp_path / "r"
    _stopped_run(run, [0, 1, 2], keep=5, failed=False)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = "\x00\x00garbage"
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    again = _recorder(run, keep=5)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        again.open({}, resume=True)
    assert "line 2 is damaged" in caplog.text
    assert again.history == [{"step": 0}, {"step": 2}]
    again.close()


@pytest.mark.parametrize("damage", ["truncated state", "garbage state", "missing state", "bad meta"])
def test_a_newest_checkpoint_that_does_not_load_falls_back_to_the_previous(tmp_path, caplog, damage):
    run = tmp_path / "r"
    _stopped_run(run, [0, 1, 2], keep=3)
    newest = run / "checkpoints" / "checkpoint_000002"
    if damage == "truncated state":
        data = (newest / "state.pt").read_bytes()
        (newest / "state.pt").write_bytes(data[: len(data) // 2])
    elif damage == "garbage state":
        size = (newest / "state.pt").stat().st_size
        (newest / "state.pt").write_bytes(b"\xff" * size)
    elif damage == "missing state":
        (newest / "state.pt").unlink()
    else:
        (newest / "meta.json").write_text('{"index": 2, "rep')
    again = _recorder(run, keep=3)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        ckpt = again.open({}, resume=True)
    assert ckpt is not None and ckpt.load()["step"] == 1
    assert "checkpoint 2" in caplog.text
    if damage != "bad meta":
        assert "resuming from checkpoint 1 instead" in caplog.text
    assert again.history == [{"step": 0}, {"step": 1}]  # the history follows the checkpoint
    _write(again, [2])  # the next commit takes a new index; the damaged one is kept aside
    again.close()
    names = sorted(os.listdir(run / "checkpoints"))
    assert names[:3] == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000003"]
    assert len(names) == 4 and names[3].startswith("damaged-checkpoint_000002-")
    assert Checkpoint(str(run / "checkpoints" / "checkpoint_000003")).load()["step"] == 2


def test_no_loadable_checkpoint_resumes_from_the_beginning(tmp_path, caplog):
    run = tmp_path / "r"
    _stopped_run(run, [0], keep=1)
    (run / "checkpoints" / "checkpoint_000000" / "state.pt").write_bytes(b"")
    again = _recorder(run, keep=1)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert again.open({}, resume=True) is None
    assert "the beginning" in caplog.text and again.history == []
    again.close()


def test_a_damaged_engine_state_is_ignored_with_a_warning(tmp_path, caplog):
    run = tmp_path / "r"
    rec = _recorder(run)
    rec.open({}, resume=False)
    rec.trace({"t": 1}, {"engine": 1})
    assert rec.engine_state() == {"engine": 1}
    (run / "adaptive_state.json").write_text("{nope")
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert rec.engine_state() is None
    assert "adaptive_state.json" in caplog.text
    rec.close()


# -- failures back off instead of spinning ----------------------------------------------
def test_failure_policy_backs_off_without_progress():
    policy = FailurePolicy(-1, backoff_s=1.0, backoff_max_s=10.0)
    assert [policy.delay(n) for n in range(1, 8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert FailurePolicy(3).delay(5) == 0.0  # no back-off configured
    failure = WorkerFailure(1, "error", "boom")
    assert policy.decide(failure, num_failures=100, in_a_row=3).delay_s == 2.0


def test_a_deterministic_error_under_unlimited_restarts_backs_off_and_says_so(tmp_path, caplog):
    rec = _recorder(tmp_path / "run")
    rec.open({}, resume=False)
    error = GroupPoll([WorkerPoll(0, "running")], [WorkerFailure(1, "error", "raised ValueError: boom")])
    group = FakeGroup([error] * 6 + [GroupPoll([WorkerPoll(0, "finished")])])
    waits: list[float] = []
    c = Controller(
        group=group, recorder=rec, scaling_policy=FixedScalingPolicy(2, 1),
        failure_policy=FailurePolicy(-1, backoff_s=1.0, backoff_max_s=4.0), poll_interval_s=0, sleep=waits.append,
    )
    with caplog.at_level(logging.WARNING, logger="raylight"):
        c.run()
    assert c.state is State.FINISHED and c.num_failures == 6
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]  # the first restart is at once
    assert "6 failures in a row with no new checkpoint, the same failure each time" in caplog.text
    assert "max_failures=-1 (without limit)" in caplog.text
    rec.close()


def test_progress_between_failures_resets_the_back_off(tmp_path):
    rec = _recorder(tmp_path / "run")
    rec.open({}, resume=False)
    error = GroupPoll([WorkerPoll(0, "running")], [WorkerFailure(1, "error", "boom")])
    progress = GroupPoll([WorkerPoll(0, "running", reports=[Report({"e": 0}, _state(0))])])
    group = FakeGroup([error, error, progress, error, GroupPoll([WorkerPoll(0, "finished")])])
    waits: list[float] = []
    c = Controller(
        group=group, recorder=rec, scaling_policy=FixedScalingPolicy(1, 1),
        failure_policy=FailurePolicy(-1, backoff_s=1.0, backoff_max_s=60.0), poll_interval_s=0, sleep=waits.append,
    )
    c.run()
    assert waits == [1.0]  # the failure after the new checkpoint restarts at once
    rec.close()


# -- resources are checked before the embedded Ray starts -------------------------------
def test_an_impossible_size_fails_before_ray_starts(tmp_path):
    code = (
        "import ray, raylight\n"
        "try:\n"
        f"    raylight.fit(lambda ctx: None, num_workers=4096, storage_path={str(tmp_path)!r}, progress=False)\n"
        "except raylight.InsufficientResourcesError as e:\n"
        "    print('ERROR', e); print('STARTED', ray.is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert "ERROR cannot place the workers: 4096 workers x {CPU: 1} need {CPU: 4096}" in out.stdout, out.stderr
    assert "STARTED False" in out.stdout and "lower num_workers" in out.stdout  # Ray never started
    assert not os.listdir(tmp_path)
