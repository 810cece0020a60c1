"""DynamoDB stream -> cleanup: in order, at least once; a failed record is retried with the
rest of the batch after it, up to ``MaximumRetryAttempts``, then the batch goes to the
on-failure destination."""

from __future__ import annotations

from typing import Any, Final

from delayq.cleanup import CleanupServices, TtlCleanup
from sim.aws import Ttl
from sim.functions import Container, Functions
from sim.world import Invocation, World

# The cleanup function's stream event source (template.yaml): BatchSize, the batching window,
# MaximumRetryAttempts; a failed invocation halves the batch it retries
# (BisectBatchOnFunctionError); a partial batch response resumes from the first failed record.
STREAM_BATCH: Final = 500
STREAM_WINDOW_MS: Final = 5000
STREAM_RETRIES: Final = 10
STREAM_RETRY_MS: Final = 1000


class StreamSource:
    """The event source's position in the TTL stream, and ``failures``: the records it gave
    up on (its on-failure destination)."""

    def __init__(self, world: World, ttl: Ttl, functions: Functions) -> None:
        self.world = world
        self.ttl = ttl
        self.functions = functions
        self.failures: list[dict[str, Any]] = []
        self._position = 0
        self._busy = False
        self._polling = False
        self._attempts = 0
        self._batch = STREAM_BATCH  # halved after a failed invocation

    def start(self) -> None:
        """Look at the stream a batching window after each TTL sweep that added records."""
        self.ttl.on_records = lambda: self._wake(STREAM_WINDOW_MS)

    def _wake(self, after_ms: int) -> None:
        """Look at the stream ``after_ms`` from now, unless a look or a batch is under way."""
        if self._busy or self._polling:
            return
        if self._position >= len(self.ttl.stream):
            return
        self._polling = True
        self.world.at(self.world.now_ms + after_ms, self.poll)

    def poll(self) -> None:
        """Invoke cleanup with the next batch from the event source's position."""
        self._polling = False
        if self._busy or self._position >= len(self.ttl.stream):
            return
        start = self._position
        batch = self.ttl.stream[start : start + self._batch]
        self._busy = True
        failed: list[int] = []

        def body(cn: Container, invocation: Invocation) -> None:
            cleanup = TtlCleanup(
                CleanupServices(cn.store, cn.delay_queue),
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
            )
            # As the handler's batch processor: every record is tried, each failure reported.
            for index, record in enumerate(batch):
                try:
                    cleanup.handle(record.raw)
                except Exception as e:  # noqa: BLE001 -- reported as a batch item failure
                    self.world.note(f"cleanup record {record.sequence} failed: {e}")
                    failed.append(index)

        def done(ok: bool) -> None:
            self._busy = False
            if ok and not failed:
                self._position = start + len(batch)
                self._attempts = 0
                self._batch = STREAM_BATCH
                self._wake(0)
                return
            if ok:  # a partial batch response: the source resumes from the first failure
                self._position = start + failed[0]
            else:  # the invocation failed: its batch is split for the retry
                self._batch = max(1, len(batch) // 2)
            self._attempts += 1
            if self._attempts > STREAM_RETRIES:
                rest = self.ttl.stream[self._position : start + len(batch)]
                self.failures.extend(r.raw for r in rest)
                self.world.faults["stream-on-failure"] += len(rest)
                self._position = start + len(batch)
                self._attempts = 0
                self._batch = STREAM_BATCH
            self._wake(STREAM_RETRY_MS)

        self.functions.invoke("cleanup", body, done)
