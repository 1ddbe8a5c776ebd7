"""The first code of a `raylight run` child process: run by its file path
(``python .../bootstrap.py SCRIPT ARGS...`` or ``... -m MODULE ARGS...``), so that the
child imports nothing of raylight; it runs the user's script as ``__main__``.

Before the script it (1) dies with its agent (Linux ``PR_SET_PDEATHSIG``: the actor
thread that started it), (2) makes ``sys.path`` and ``sys.argv`` what ``python SCRIPT``
(or ``python -m MODULE``) would make them, (3) wraps
``torch.distributed.init_process_group`` so that the agent learns when this rank enters
and completes it: the driver names a rank that never does (``--init-timeout``), and (4)
collects garbage at exit (see ``raylight.launcher_env.collect_at_exit``).
Standard library only, apart from torch where it is installed.
"""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import runpy
import signal
import sys
from typing import Any

CHANNEL_ENV = "RAYLIGHT_RUN_CHANNEL"  # host:port of the agent's listener
KEY_ENV = "RAYLIGHT_RUN_AUTHKEY"  # hex; the listener's authentication key
PARENT_ENV = "RAYLIGHT_RUN_PARENT"  # the agent's pid
PR_SET_PDEATHSIG = 1


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
    address, key = os.environ.get(CHANNEL_ENV), os.environ.get(KEY_ENV)
    if not address or not key:
        return
    from multiprocessing.connection import Client

    host, port = address.rsplit(":", 1)
    try:
        with Client((host, int(port)), authkey=bytes.fromhex(key)) as conn:
            conn.send_bytes(json.dumps({"op": "event", "event": event}).encode())
            conn.recv_bytes()
    except OSError:
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


def main(argv: list[str]) -> None:
    _die_with_parent()
    # raylight.launcher_env.collect_at_exit, without importing raylight: free what DDP
    # left in reference cycles before the interpreter's teardown, where a gloo thread
    # freeing the last collective's work aborts a finished run (exit code 134)
    atexit.register(gc.collect)
    if os.environ.get("RAYLIGHT_HOROVOD_COMPAT", "").strip() not in ("", "0"):
        # `import horovod.torch` serves raylight.horovod (imported only when asked for)
        from raylight.horovod.compat import install_from_env

        install_from_env()
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
