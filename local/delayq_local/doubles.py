"""Helpers for tests of code that runs on the local stack: fake handlers and bounded waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class RecordingHandler:
    """A fake Lambda handler: records every event (and its context), answers via `respond`.

    `respond(event, context)` may return a response or raise; by default the handler returns
    None (a plain success).
    """

    def __init__(self, respond: Callable[[Any, Any], Any] | None = None) -> None:
        self.events: list[Any] = []
        self.contexts: list[Any] = []
        self.times: list[float] = []
        self._respond = respond
        self._lock = threading.Lock()

    def __call__(self, event: Any, context: Any) -> Any:
        with self._lock:
            self.events.append(event)
            self.contexts.append(context)
            self.times.append(time.time())
        return self._respond(event, context) if self._respond else None

    @property
    def calls(self) -> int:
        """How many times the handler was invoked."""
        with self._lock:
            return len(self.events)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
