"""The first code of a `raylight run` child process: run by its file path
(``python .../bootstrap.py SCRIPT ARGS...`` or ``... -m MODULE ARGS...``), so that the
child imports nothing of raylight; it runs the user's script as ``__main__``.

Before the script it (1) dies with its agent (Linux ``PR_SET_PDEATHSIG``: the actor
thread that started it), (2) makes ``sys.path`` and ``sys.argv`` what ``python SCRIPT``
(or ``python -m MODULE``) would make them, (3) wraps
``torch.distributed.init_process_group`` so that the agent learns when this rank enters
and completes it: the driver names a rank that never does (``--init-timeout``), (4)
collects garbage at exit (see ``raylight.worker.process_group.collect_at_exit``), and (5) unless
``RAYLIGHT_HOROVOD_COMPAT=1`` serves ``raylight.horovod``, guards a Horovod script (see
``_HorovodGuard``), and (6) serves ``import adaptdl`` with ``raylight.adaptdl`` where
AdaptDL is not installed (``_AdaptDLHook``; ``RAYLIGHT_ADAPTDL=1``: even where it is, ``0``:
never). Standard library only, apart from torch where it is installed.

It tells the agent of those two events over the agent channel, whose wire is the core's
``raylight.worker.run_wire`` (as ``raylight.run_context()``'s): loaded by its file path, so
that it stays standard library only and imports nothing of raylight.
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib.abc
import importlib.machinery
import json
import os
import runpy
import signal
import sys
from typing import Any

PARENT_ENV = "RAYLIGHT_RUN_PARENT"  # the agent's pid
PR_SET_PDEATHSIG = 1


def _load_wire() -> Any:
    """The agent channel's wire (``raylight.worker.run_wire``): imported as a module where
    this file is (the agent imports it), loaded by its path where this file runs as the
    child's first code, so that nothing of raylight is imported before the script."""
    if __name__ != "__main__":
        from raylight.worker import run_wire

        return run_wire
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "worker", "run_wire.py")
    spec = importlib.util.spec_from_file_location("_raylight_run_wire", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_wire = _load_wire()


def _die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (the agent's actor is
    killed); exit now if that already happened."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    parent = os.environ.get(PARENT_ENV)
    if parent and os.getppid() != int(parent):
        os._exit(1)


def _tell(event: str) -> None:
    """One event for the agent on a connection of its own (never fails the script)."""
    address, key = os.environ.get(_wire.CHANNEL_ENV), os.environ.get(_wire.KEY_ENV)
    if not address or not key:
        return
    try:
        with _wire.connect(address, bytes.fromhex(key)) as sock:
            _wire.send_frame(sock, json.dumps({"op": "event", "event": event}).encode())
            _wire.recv_frame(sock)
    except (OSError, EOFError, ValueError):
        pass


def _watch_init() -> None:
    """Wrap init_process_group where scripts find it (``torch.distributed`` and
    ``distributed_c10d``) before the script imports it."""
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
    except ImportError:  # no torch here: the script cannot call it either
        return
    original = c10d.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        _tell("init_entered")
        result = original(*args, **kwargs)
        _tell("init_done")
        return result

    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


HOROVOD_HINT = (
    "run `raylight run ... -m raylight.horovod SCRIPT` (or set RAYLIGHT_HOROVOD_COMPAT=1) to give "
    "`import horovod.torch` raylight.horovod on this run's group, or start real Horovod with "
    "`horovodrun --gloo -np N python SCRIPT` (docs/horovod.md)"
)


class _HorovodGuard(importlib.abc.MetaPathFinder):
    """A Horovod script under ``raylight run`` without raylight.horovod, where real
    Horovod is installed: its ``hvd.init()`` cannot join this run's group (it forms groups
    under horovodrun or MPI only), so every rank would train alone. ``init`` fails instead
    when the group it formed is not this run's size. (Where Horovod is not installed,
    ``main`` adds the fix to the import's error.)"""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "horovod.torch":
            return None
        others = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        spec = next((s for f in others if (s := f.find_spec(name, path, target)) is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, exec_module = spec.loader, spec.loader.exec_module

        def exec_and_guard(module: Any) -> None:
            exec_module(module)
            _guard_init(module)

        loader.exec_module = exec_and_guard  # type: ignore[method-assign]
        return spec


def _guard_init(hvd: Any) -> None:
    original = getattr(hvd, "init", None)
    if original is None:
        return

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        world = int(os.environ.get("WORLD_SIZE") or 1)
        if world > 1 and hvd.size() != world:
            raise RuntimeError(
                f"real Horovod's hvd.init() formed a group of {hvd.size()} under `raylight run`, whose "
                f"group has {world} ranks: every rank would train alone. {HOROVOD_HINT[0].upper()}{HOROVOD_HINT[1:]}"
            )
        return result

    hvd.init = init


class _AdaptDLHook(importlib.abc.MetaPathFinder):
    """``import adaptdl`` under `raylight run`: on the script's first import of it (and only
    then, so that a script without AdaptDL imports nothing of raylight), install
    ``raylight.worker.adl.compat``'s hook, which serves ``raylight.adaptdl`` unless real
    AdaptDL is installed (``RAYLIGHT_ADAPTDL=1``: even then), and step aside."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "adaptdl" and not name.startswith("adaptdl."):
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from raylight.worker.adl import compat

        if compat.install_from_env():  # this import too: the hook now stands in front
            return compat.find_served_spec(name, path, target)
        return None  # real AdaptDL


def main(argv: list[str]) -> None:
    _die_with_parent()
    # raylight.worker.process_group.collect_at_exit, without importing raylight: free what DDP
    # left in reference cycles before the interpreter's teardown, where a gloo thread
    # freeing the last collective's work aborts a finished run (exit code 134)
    atexit.register(gc.collect)
    if os.environ.get("RAYLIGHT_HOROVOD_COMPAT", "").strip() not in ("", "0"):
        # `import horovod.torch` serves raylight.horovod (imported only when asked for)
        from raylight.worker.hvd.compat import install_from_env

        install_from_env()
    elif argv[:2] != ["-m", "raylight.horovod"]:  # which serves raylight.horovod itself
        sys.meta_path.insert(0, _HorovodGuard())
    if os.environ.get("RAYLIGHT_ADAPTDL", "").strip() != "0":
        sys.meta_path.insert(0, _AdaptDLHook())
    try:
        _run(argv)
    except ModuleNotFoundError as exc:
        if exc.name in ("horovod", "horovod.torch") and hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"Horovod is not installed here: {HOROVOD_HINT}")
        raise


def _run(argv: list[str]) -> None:
    if argv[:1] == ["-m"]:
        module, args = argv[1], argv[2:]
        sys.path[0] = os.getcwd()  # as `python -m` does
        sys.argv = [module, *args]  # run_module puts the module's file in argv[0]
        _watch_init()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` does
        sys.argv = [script, *args]
        _watch_init()
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
