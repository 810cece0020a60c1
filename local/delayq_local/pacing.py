"""Pacing: a token-bucket pacer that spreads work over time on an injected clock and sleep.

In-process and per run (a redrive's moves, ``redrive --rate``); the tenant limits that hold
across containers are DynamoDB counters (``delayq.shaping``).
"""

from __future__ import annotations

import math
import time

from delayq.clock import Clock, Sleep, system_clock
from delayq.exceptions import ConfigurationError

__all__ = [
    "Pacer",
]


class Pacer:
    """Paces work to ``rate_per_second`` on average, in bursts of at most ``capacity``.

    It starts full; ``take`` sleeps (on the injected ``sleep``) until enough tokens
    have accumulated on the injected ``clock`` (epoch milliseconds).
    """

    def __init__(
        self,
        rate_per_second: float,
        *,
        capacity: float | None = None,
        clock: Clock = system_clock,
        sleep: Sleep = time.sleep,
    ) -> None:
        if not (math.isfinite(rate_per_second) and rate_per_second > 0):
            raise ConfigurationError(f"rate_per_second must be > 0, not {rate_per_second!r}")
        size = rate_per_second if capacity is None else capacity
        if not (math.isfinite(size) and size > 0):
            raise ConfigurationError(f"capacity must be > 0, not {capacity!r}")
        self.rate = rate_per_second
        self.capacity = max(1.0, size)
        self.waited_seconds = 0.0
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.capacity
        self._at_ms = clock()

    def take(self, n: int) -> None:
        """Wait until ``n`` tokens are there, then use them."""
        if n > self.capacity:
            raise ValueError(f"cannot take {n} tokens at once (capacity {self.capacity})")
        self._refill()
        while self._tokens < n:
            pause = (n - self._tokens) / self.rate
            self._sleep(pause)
            self.waited_seconds += pause
            self._refill()
        self._tokens -= n

    def give_back(self, n: int) -> None:
        """Return tokens taken for work that did not happen."""
        self._tokens = min(self.capacity, self._tokens + n)

    def _refill(self) -> None:
        now = self._clock()
        gained = max(0, now - self._at_ms) * self.rate / 1000
        self._tokens = min(self.capacity, self._tokens + gained)
        self._at_ms = now
