"""``horovod.runner.util.threads``, which Horovod's own test helpers import
(``test/utils/common.py``: ``in_thread``), served by the import hook (``compat.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_thread(target: Callable[..., Any], args: tuple[Any, ...] = (), name: str | None = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a thread and return the thread; ``silent`` swallows its
    exceptions."""
    if not isinstance(args, tuple):
        raise ValueError(f"in_thread: args must be a tuple, not {type(args).__name__}; for one argument use (arg,)")

    def run(*a: Any) -> None:
        try:
            target(*a)
        except Exception:
            if not silent:
                raise

    thread = threading.Thread(target=run, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event: threading.Event, func: Callable[..., Any], args: tuple[Any, ...] = (),
             stop: threading.Event | None = None, check_stop_interval_s: float = 1.0,
             daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Call ``func(*args)`` in a thread once ``event`` is set, unless ``stop`` is set first."""
    if event is None:
        raise ValueError("on_event: event must not be None")
    if stop is None and not daemon:
        raise ValueError("on_event: a non-daemon thread needs a stop event")

    def wait_then_call() -> None:
        while not event.is_set():
            if stop is not None and stop.is_set():
                return
            event.wait(check_stop_interval_s)
        if stop is None or not stop.is_set():
            func(*args)

    return in_thread(wait_then_call, daemon=daemon, silent=silent)
