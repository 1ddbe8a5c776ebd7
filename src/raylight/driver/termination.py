"""A driver's SIGTERM: an orderly stop, then the conventional exit code 143.

A node being preempted or scaled down (a spot instance's shutdown, a pod's eviction, Ray
stopping a Job's driver there) sends SIGTERM. ``ray.init`` replaces Python's default
(end at once, no cleanup) with ``sys.exit(15)``, so a driver exited 15: not what a shell,
``raylight submit --retries`` or a scheduler reads as "terminated". raylight's driver
handles it instead with ``Terminated``, a ``SystemExit(143)`` raised in the main thread:
``finally`` blocks and ``except Exception`` handlers leave it alone, so the run stops the
way Ctrl-C stops it (workers stopped, committed checkpoints kept, ``status.json``
written, the embedded Ray shut down at exit), and the process then exits 143 with no
traceback. Whatever fails while the run stops (the cluster may be going away too) does
not change that code: ``Trainer.fit`` turns it into ``Terminated``.

A SIGTERM handler the user installed is left alone.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from raylight.base.exit_codes import TERMINATED_EXIT_CODE

log = logging.getLogger("raylight")
_received = threading.Event()


class Terminated(SystemExit):
    """The driver got SIGTERM; exits ``TERMINATED_EXIT_CODE`` (143)."""

    def __init__(self) -> None:
        super().__init__(TERMINATED_EXIT_CODE)

    def __str__(self) -> str:
        return f"the driver got SIGTERM (exit code {TERMINATED_EXIT_CODE})"


def received() -> bool:
    """Whether this process got SIGTERM while raylight's handler was installed."""
    return _received.is_set()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _received.is_set():  # a second SIGTERM must not cut the stop the first began
        log.warning("got SIGTERM again: still stopping the run")
        return
    _received.set()
    log.warning("got SIGTERM: stopping the run (its committed checkpoints are kept), then exiting %d", TERMINATED_EXIT_CODE)
    raise Terminated()


def _replaceable(handler: Any) -> bool:
    """Python's default, or the one ``ray.init`` installs (``sys.exit(15)``)."""
    if handler in (signal.SIG_DFL, None):
        return True
    return getattr(handler, "__module__", "") == "ray._private.worker"


def install() -> bool:
    """Handle SIGTERM as described above, from the main thread (the only one Python
    runs handlers in); whether it is installed now."""
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return True
    if not _replaceable(current):
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True
