"""The one clock raylight reads; tests patch ``monotonic`` to control time."""

from __future__ import annotations

import time


def monotonic() -> float:
    return time.monotonic()


def wall() -> float:
    return time.time()
