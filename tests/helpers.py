"""Helpers shared by tests and the driver scripts they run."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, proc: Any = None) -> None:
    """Wait for a condition a test can observe (a file, a trace row), with a deadline.
    ``proc``: a subprocess whose early exit fails the wait at once."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}:\n{output}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def read_trace(run_dir: str) -> list[dict[str, Any]]:
    """The rows of a run's adaptive.jsonl (none before it exists)."""
    path = os.path.join(run_dir, "adaptive.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
