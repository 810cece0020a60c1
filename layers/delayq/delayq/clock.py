"""Clocks are injected (epoch milliseconds) so tests can skew, freeze and advance time."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = [
    "Clock",
    "Sleep",
    "handler_clock",
    "set_handler_clock",
    "system_clock",
]

Clock = Callable[[], int]
Sleep = Callable[[float], None]

# Clocks set for handler modules about to be imported, by module name (see `handler_clock`).
_handler_clocks: dict[str, Clock] = {}


def system_clock() -> int:
    """Wall-clock epoch milliseconds."""
    return time.time_ns() // 1_000_000


def handler_clock(module: str) -> Clock:
    """The clock a handler module (`module` is its `__name__`) passes to the layer.

    Called once, when the handler module is imported, so the invocation path does not change:
    on AWS it is always `system_clock`. A local harness that imports a handler under a name of
    its choosing may set another clock for that name first (`set_handler_clock`): that is how
    the local stack skews one function's clock.
    """
    return _handler_clocks.pop(module, system_clock)


def set_handler_clock(module: str, clock: Clock) -> None:
    """Make the next `handler_clock(module)` return `clock` instead of the system clock."""
    _handler_clocks[module] = clock
