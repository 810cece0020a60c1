"""A clock that moves only when told, a back-off that never waits, an executor that runs
each task in the caller's thread (so a run is deterministic: no pool thread interleaves AWS
calls)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, Final, TypeVar

from delayq.retry import Backoff

# 2026-11-21T08:00:00Z: a fixed "now" for tests and benchmarks that freeze time.
NOW_MS: Final = 1_795_248_000_000

T = TypeVar("T")


class FakeClock:
    """Epoch milliseconds that move only when told, or when something sleeps on them
    (``slept`` lists each pause in seconds; ``slept_ms`` is their total, rounded as applied)."""

    def __init__(self, now_ms: int = NOW_MS) -> None:
        self.now_ms = now_ms
        self.slept: list[float] = []
        self.slept_ms = 0

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        """Move time forward."""
        self.now_ms += ms

    def sleep(self, seconds: float) -> None:
        """What the emitter calls to hold a message: time moves, nothing waits."""
        ms = max(1, round(seconds * 1000))
        self.slept.append(seconds)
        self.slept_ms += ms
        self.now_ms += ms


def no_sleep_backoff(
    max_attempts: int = 8, sleep: Callable[[float], None] | None = None
) -> Backoff:
    """The layer's back-off policy without real pauses (pass ``FakeClock.sleep`` to record
    them); seeded jitter."""
    return Backoff(max_attempts=max_attempts, rng=random.Random(7), sleep=sleep or (lambda _: None))


class SerialExecutor(Executor):
    """Runs each submitted task at once, in the caller's thread."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 -- handed to the caller, as a pool would
            future.set_exception(e)
        return future

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]:
        return iter([fn(*args) for args in zip(*iterables, strict=False)])
