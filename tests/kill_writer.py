"""SIGKILL a run's writer at chosen points of its file operations, resume, and check.

    python -m tests.kill_writer RUN_DIR SEED CYCLES

One process imports raylight and torch once, then for each cycle forks a writer: a
driver's recorder resuming the run and recording reports (a checkpoint every other
report, two kept, so every cycle commits and deletes). The writer counts its file-system
operations (renames, fsyncs, directory and file creation, removals) and SIGKILLs itself
at the one the seeded schedule picked, before or after performing it. The parent then
opens the run the way a resuming driver does and prints one JSON line per cycle: where
the writer died, what debris it left, and what the next open found (leftovers,
checkpoints that do not load, whether the history is contiguous).
"""

from __future__ import annotations

import builtins
import json
import os
import random
import shutil
import signal
import sys
from typing import Any

import torch

from raylight.driver.recorder import RunRecorder
from raylight.storage.checkpoint import deserialize_state, serialize_state
from raylight.storage.run_dir import RunStorage
from raylight.worker.protocol import Report

# The operations a kill can land on, and the raylight functions whose work they are.
OS_OPS = ("rename", "replace", "fsync", "makedirs", "mkdir", "unlink", "remove", "rmdir", "ftruncate", "pwrite")
CONTEXTS = (
    "commit_checkpoint", "delete_checkpoint", "append_line", "write_bytes", "clean_debris",
    "set_aside", "replace_dir", "_acquire_flock", "release", "makedirs",
)


def _context() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_name
        if name in CONTEXTS and "raylight" in frame.f_code.co_filename:
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return "other"


def _install_kill(target: int, before: bool, report_fd: int) -> None:
    """Count file operations; at the ``target``-th, SIGKILL this process."""
    count = [0]

    def hit(op: str) -> None:
        count[0] += 1
        if count[0] == target:
            os.write(report_fd, json.dumps({"op": op, "where": _context(), "before": before}).encode())
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(owner: Any, name: str, label: str, writes_only: bool = False) -> None:
        real = getattr(owner, name)

        def hooked(*args: Any, **kwargs: Any) -> Any:
            counts = not writes_only or any(c in str(args[1] if len(args) > 1 else kwargs.get("mode", "r")) for c in "wax+")
            if counts and before:
                hit(label)
            result = real(*args, **kwargs)
            if counts and not before:
                hit(label)
            return result

        setattr(owner, name, hooked)

    for op in OS_OPS:
        wrap(os, op, op)
    wrap(shutil, "rmtree", "rmtree")
    wrap(builtins, "open", "open", writes_only=True)


def writer(run_dir: str) -> None:
    rec = RunRecorder(RunStorage(run_dir), checkpoints_to_keep=2)
    rec.open({"writer": os.getpid()}, resume=True)
    step = len(rec.history)
    while True:
        state = None
        if step % 2 == 0:
            state = serialize_state({"step": step, "w": torch.full((2048,), float(step))})
        rec.record(Report({"step": step}, state, time=float(step), seq=step), num_workers=1)
        step += 1


def verify(run_dir: str) -> dict[str, Any]:
    storage = RunStorage(run_dir)
    scan = storage.scan_checkpoints()
    debris = scan.debris + [n for n in storage.entries() if n.startswith(".tmp-")]
    rec = RunRecorder(storage, checkpoints_to_keep=2)
    latest = rec.open({"verifier": True}, resume=True)
    after = storage.scan_checkpoints()
    leftovers = after.debris + [n for n in storage.entries() if n.startswith(".tmp-")]
    unloadable = []
    for ckpt in after.committed:
        try:
            state = deserialize_state(storage.read_state(ckpt.index))
            if state["step"] != ckpt.meta["report"]:
                unloadable.append(f"{ckpt.index}: step {state['step']} at report {ckpt.meta['report']}")
        except Exception as exc:
            unloadable.append(f"{ckpt.index}: {type(exc).__name__}: {exc}")
    steps = [row["step"] for row in rec.history]
    on_disk = []
    if storage.exists("metrics.jsonl"):
        on_disk = [json.loads(line)["step"] for line in storage.read_text("metrics.jsonl").splitlines() if line]
    resumed_at = int(latest.metadata["report"]) if latest is not None else -1
    contiguous = steps == list(range(len(steps))) and on_disk == steps and len(steps) == resumed_at + 1
    damaged = [n for n in storage.entries("checkpoints") if n.startswith("damaged-")]
    rec.close(RuntimeError("verified"))
    return {
        "debris": debris, "leftovers": leftovers, "unloadable": unloadable, "damaged": damaged,
        "contiguous": contiguous, "resumed_at_report": resumed_at, "checkpoints": [c.index for c in after.committed],
    }


def main() -> None:
    run_dir, seed, cycles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    torch.set_num_threads(1)
    for cycle in range(cycles):
        target, before = rng.randint(1, 90), rng.random() < 0.5
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer
            os.close(read_fd)
            _install_kill(target, before, write_fd)
            try:
                writer(run_dir)
            finally:
                os._exit(3)  # never here: the writer only ends by its kill
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read_fd) as pipe:
            died = json.loads(pipe.read() or "{}")
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        row = {"cycle": cycle, "target": target, "killed": killed, **died, **verify(run_dir)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
