"""Whether a worker process can serve another run (``raylight.worker_group.pool``), and
putting it back as a new process has it.

A process serves again only when its loop finished, no process group is left (nor
DeepSpeed's state bound to one), and the loop left no threads or child processes
running. Its environment variables, torch's default dtype and deterministic mode and
the random generators are then put back (``ProcessState``), and the objects frozen out
of the garbage collector's reach (``freeze_long_lived``) are let back in. Before it
joins a run it refuses when a user module it imported changed on disk, or the driver
now has that module from another file.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from raylight.worker_group.user_code import moved_modules, user_modules


def freeze_long_lived(point: str) -> None:
    """Move every object alive now out of the garbage collector's reach, once per worker
    process for each ``point``: "start" (torch, Ray and the user's module imported) and
    "first batch" (the loop's own setup done: imports inside it, dataset, model).

    A full (generation 2) collection walks every tracked object: with torch and Ray
    imported that is about 290,000 of them and takes 130-200 ms. It comes every few
    thousand steps of a small model, and in data-parallel training a pause on one rank
    stalls every rank at the next all-reduce. Objects alive at these two points are
    long-lived anyway; those the loop makes later are collected as before.
    """
    if point not in _FROZEN:
        _FROZEN.add(point)
        gc.freeze()


_FROZEN: set[str] = set()


class ProcessReuse:
    """A worker process as it was when it started, and the user modules it holds."""

    def __init__(self) -> None:
        self._fresh = ProcessState.now()
        self._threads = {t.ident for t in threading.enumerate()}
        self._tidying: threading.Thread | None = None
        self._imported: dict[str, float] = {}  # user module file -> mtime, at release
        self._held: dict[str, str] = {}  # user module name -> file, at release

    def refusal(self) -> str | None:
        """Why this process, whose loop finished, cannot serve another run; None if it can."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return "a process group is still initialised"
        from raylight.worker.strategies.deepspeed import holds_process_groups

        if holds_process_groups():  # the loop destroyed the group itself, past deepspeed.comm
            return "DeepSpeed keeps process-wide state bound to the old process group"
        left = [
            t.name for t in threading.enumerate()
            if t.is_alive() and t.ident not in self._threads and not t.name.startswith("raylight-")
        ]
        if left:
            return f"the loop left threads running: {left[:3]}"
        children = _child_processes()
        if children:
            return f"the loop left child processes running: {children[:3]}"
        return None

    def tidy(self) -> None:
        """Note the user's modules now (the user may edit them next), then put the
        process back as it started, in the background."""
        self.note_imports()
        self._tidying = threading.Thread(target=self._tidy, name="raylight-tidy", daemon=True)
        self._tidying.start()

    def _tidy(self) -> None:
        self._fresh.restore()
        _FROZEN.clear()
        gc.unfreeze()
        gc.collect()

    def note_imports(self) -> None:
        """The user's modules this process holds (name -> file) and their files'
        modification times, which ``refusal_to_join`` checks before it serves another run."""
        self._held = user_modules()
        self._imported = {path: mtime for path in self._held.values() if (mtime := _mtime(path)) is not None}

    def refusal_to_join(self, driver_modules: dict[str, str]) -> str | None:
        """Once tidied: why this process cannot join a run whose driver has
        ``driver_modules`` (name -> file); None if it can."""
        if self._tidying is not None:
            self._tidying.join()
            self._tidying = None
        changed = [f for f, mtime in self._imported.items() if _mtime(f) != mtime]
        if changed:
            return f"modules it imported changed on disk: {changed[:3]}"
        moved = moved_modules(self._held, driver_modules)
        if moved:
            return f"the driver now imports modules it holds from other files: {moved[:3]}"
        return None


@dataclass
class ProcessState:
    """Process-wide state a training loop may change, as a new process has it:
    environment variables, torch's default dtype and deterministic mode as now, and
    random generators seeded afresh from the OS (torch, numpy's global one, Python's), as
    a new worker's are: an unseeded loop draws differently in every run either way.

    Deterministic mode is set back only where the loop changed it: the setter imports
    torch's compiler stack (about 800 modules, 1.0-1.4 CPU-s on this project's 2 cores),
    which every pooled worker paid after every run before."""

    env: dict[str, str]
    dtype: Any
    deterministic: tuple[bool, bool]  # (enabled, warn only)

    @classmethod
    def now(cls) -> ProcessState:
        import torch

        return cls(dict(os.environ), torch.get_default_dtype(), _deterministic_mode())

    def restore(self) -> None:
        import random

        import torch

        for key in [k for k in os.environ if k not in self.env]:
            del os.environ[key]
        os.environ.update(self.env)
        torch.set_default_dtype(self.dtype)
        if _deterministic_mode() != self.deterministic:
            enabled, warn_only = self.deterministic
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.seed()
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()


def _deterministic_mode() -> tuple[bool, bool]:
    """torch's deterministic-algorithms mode now: (enabled, warn only)."""
    import torch

    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _child_processes() -> list[int]:
    try:
        import psutil
    except ImportError:  # Ray depends on psutil; without it, assume none
        return []
    return [c.pid for c in psutil.Process().children() if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


