"""What every emulated event source shares: worker threads, stop/pause, counters, and Lambda's
reading of a partial batch response."""

from __future__ import annotations

import abc
import logging
import threading
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any, Final, Self

from delayq_local.sandbox import ExecutionEnvironment, Invocation, LocalFunction, polling_for

log = logging.getLogger(__name__)

POLL_ERROR_BACKOFF_SECONDS: Final = 1.0


class Counters:
    """Thread-safe named counters (`invocations`, `errors`, `records`, ...)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, amount: int = 1) -> None:
        """Add `amount` to counter `name`."""
        with self._lock:
            self._counts[name] += amount

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counts)


class EventSource(abc.ABC):
    """A poller in its own thread(s): `start`, `stop`, `pause`/`resume`, `stats`.

    `threads` workers run `_work(index)`; the function gets `environments` execution
    environments. Environments are created by `prepare()` (called by `start()` if needed) on
    the caller's thread, so that handler modules are imported before any worker runs.
    """

    def __init__(
        self,
        name: str,
        function: LocalFunction | None,
        environments: int = 1,
        threads: int | None = None,
    ) -> None:
        self.name = name
        self.function = function
        self.stats = Counters()
        self._environment_count = environments
        self._workers = threads if threads is not None else environments
        self._environments: list[ExecutionEnvironment] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()

    def prepare(self) -> Self:
        """Load the execution environments (each a cold start of the handler)."""
        if self.function is not None and not self._environments:
            self._environments = [
                self.function.environment() for _ in range(self._environment_count)
            ]
        return self

    def start(self) -> Self:
        """Start the worker threads."""
        if self._threads:
            return self
        self.prepare()
        self._stop.clear()
        for index in range(self._workers):
            thread = threading.Thread(
                target=self._guarded, args=(index,), name=f"{self.name}-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the workers to finish their current batch, and wait for them."""
        self.request_stop()
        self.join(timeout)

    def request_stop(self) -> None:
        """Ask the workers to stop after their current batch (without waiting)."""
        self._stop.set()
        self._running.set()

    def join(self, timeout: float = 30.0) -> None:
        """Wait for the workers to end (after `request_stop()`)."""
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s did not stop within %.0fs", thread.name, timeout)
        self._threads.clear()

    def pause(self) -> None:
        """Stop polling after the current batch, until `resume()`."""
        self._running.clear()

    def resume(self) -> None:
        """Poll again."""
        self._running.set()

    @property
    def paused(self) -> bool:
        """True between `pause()` and `resume()`."""
        return not self._running.is_set()

    def _active(self) -> bool:
        """Block while paused; False once stopping."""
        while not self._stop.is_set():
            if self._running.wait(0.2):
                return not self._stop.is_set()
        return False

    def _sleep(self, seconds: float) -> None:
        """Sleep, waking early when stopping."""
        self._stop.wait(seconds)

    def _environment(self, index: int) -> ExecutionEnvironment:
        return self._environments[index]

    def _guarded(self, index: int) -> None:
        # Lambda's pollers and destinations act with the function's execution role.
        with polling_for(self.function.logical_id if self.function is not None else ""):
            self._poll_forever(index)

    def _poll_forever(self, index: int) -> None:
        while self._active():
            try:
                self._work(index)
            # A poller survives what its endpoint throws at it, as Lambda's pollers do; each
            # failure is counted and logged, then the worker starts over after a pause.
            except Exception:
                self.stats.add("poll_errors")
                log.exception("%s worker %d failed; restarting it", self.name, index)
                self._sleep(POLL_ERROR_BACKOFF_SECONDS)

    @abc.abstractmethod
    def _work(self, index: int) -> None:
        """Poll and invoke until `_active()` turns False."""

    def _invoke(self, index: int, event: Any, records: int) -> Invocation:
        invocation = self._environment(index).invoke(event)
        self.stats.add("invocations")
        self.stats.add("records", records)
        if not invocation.ok:
            self.stats.add("errors")
        if invocation.crashed and self.function is not None:
            # Lambda starts a new environment after a process exit: a cold start.
            self.stats.add("crashes")
            self._environments[index] = self.function.environment()
        return invocation


def failed_items(invocation: Invocation, known: Collection[str]) -> set[str] | None:
    """The item identifiers a `ReportBatchItemFailures` response marks as failed.

    None means the whole batch failed: the function raised or timed out, or the response is one
    Lambda rejects (not an object, an item without a valid `itemIdentifier`, an unknown id).
    """
    if not invocation.ok:
        return None
    response = invocation.response
    if response is None:
        return set()
    if not isinstance(response, Mapping):
        log.warning("partial batch response is not an object: %r", response)
        return None
    failures = response.get("batchItemFailures") or []
    if not isinstance(failures, list):
        log.warning("batchItemFailures is not a list: %r", failures)
        return None
    failed: set[str] = set()
    for item in failures:
        identifier = item.get("itemIdentifier") if isinstance(item, Mapping) else None
        if not isinstance(identifier, str) or identifier not in known:
            log.warning("bad itemIdentifier in partial batch response: %r", item)
            return None
        failed.add(identifier)
    return failed
