"""Clocks are injected (epoch milliseconds) so tests can skew, freeze and advance time."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]
Sleep = Callable[[float], None]


def system_clock() -> int:
    """Wall-clock epoch milliseconds."""
    return time.time_ns() // 1_000_000
