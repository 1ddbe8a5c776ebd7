"""Test hooks around the declarative loop (``raylight train``'s), for the tests of runs
that survive a worker's or a driver's death (tests/declarative/test_declarative_resume.py).

A hook is the product's own ``declarative_loop`` with its context's ``report`` wrapped:
the test patches ``raylight.declarative.train.declarative_loop`` with a
``functools.partial`` of one of these in the driver's process (``api.train`` imports the
loop when it trains), and the workers unpickle it by reference. ``marker`` makes the hook
act in the first attempt only: it is written when the hook acts.

``python -m tests.support.declarative_hooks MARKER BLOCK_AFTER ARGS...`` runs ``raylight ARGS``
(the CLI) in this process with rank 0 blocking for good after its report of epoch
BLOCK_AFTER: a driver a test SIGKILLs in the middle of a run.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from typing import Any


def _wrapped(ctx: Any, config: dict[str, Any], *, marker: str, after_epoch: int, rank: int, act: Any) -> None:
    from raylight.declarative.train import declarative_loop  # a worker's: the product's own

    assert not isinstance(declarative_loop, functools.partial), "the patch is the driver's alone"
    report = ctx.report

    def report_then_act(metrics: dict[str, Any], checkpoint: Any = None) -> None:
        report(metrics, checkpoint=checkpoint)
        if ctx.rank == rank and metrics.get("epoch") == after_epoch and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            act()

    ctx.report = report_then_act
    declarative_loop(ctx, config)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _block() -> None:
    threading.Event().wait()  # never set: the driver is killed while rank 0 waits here


def killing_loop(ctx: Any, config: dict[str, Any], *, marker: str, after_epoch: int) -> None:
    """Rank 1 SIGKILLs its own process right after its report of ``after_epoch``."""
    _wrapped(ctx, config, marker=marker, after_epoch=after_epoch, rank=1, act=_die)


def blocking_loop(ctx: Any, config: dict[str, Any], *, marker: str, after_epoch: int) -> None:
    """Rank 0 stops for good right after its report of ``after_epoch`` (its checkpoint is
    committed by the driver's next poll; the actor still answers polls)."""
    _wrapped(ctx, config, marker=marker, after_epoch=after_epoch, rank=0, act=_block)


def patch(hook: Any, *, marker: str, after_epoch: int) -> Any:
    """Make ``raylight.declarative.train.declarative_loop`` the hook; returns the product's
    loop, to put back."""
    import raylight.declarative.train as train

    original = train.declarative_loop
    train.declarative_loop = functools.partial(hook, marker=marker, after_epoch=after_epoch)  # type: ignore[assignment]
    return original


if __name__ == "__main__":
    marker, block_after, *args = sys.argv[1:]
    patch(blocking_loop, marker=marker, after_epoch=int(block_after))
    from raylight.cli.main import main

    sys.argv = ["raylight", *args]
    main()
