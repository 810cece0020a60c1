"""DynamoDB stream -> cleanup: at least once; a failed record is retried with the rest of its
batch after it, up to ``MaximumRetryAttempts``, then the batch goes to the on-failure
destination.

With a ``ParallelizationFactor`` above 1, Lambda processes that many batches of one shard at
once and keeps the records of one key in order. Modelled as lanes: each item key belongs to
one lane (a stable hash of it), each lane is read as a shard is with a factor of 1 (one
batch at a time, in order, its own retries and bisection), and the lanes run concurrently. A
key's later record thus waits while an earlier one is in flight or failed and retried, while
other keys' records go on. Lanes go by the item's whole key (partition and sort key): every
record of one item keeps its order, and where AWS orders by the partition key alone it lets
fewer records overtake each other than this model does, never more.

The stream keeps a record 24 hours. While the source cannot invoke the function (``down``:
Lambda throttles it, no concurrency left) it waits and retries, as AWS retries a throttled
invocation until its records expire; records older than the retention are trimmed before
they are read (``trimmed``), and the source goes on from the oldest record left.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from delayq.cleanup import CleanupServices, TtlCleanup
from sim.aws import STREAM_RETENTION_MS, StreamRecord, Ttl
from sim.functions import Container, Functions
from sim.world import Invocation, World

# The cleanup function's stream event source (template.yaml): BatchSize, the batching window,
# ParallelizationFactor, MaximumRetryAttempts; a failed invocation halves the batch it retries
# (BisectBatchOnFunctionError); a partial batch response resumes from the first failed record.
STREAM_BATCH: Final = 500
STREAM_WINDOW_MS: Final = 5000
STREAM_PARALLELIZATION: Final = 2
STREAM_RETRIES: Final = 10
STREAM_RETRY_MS: Final = 1000


def lane_of(record: StreamRecord) -> int:
    """The lane of a record's item key: the same for every record of one item, in every run
    (``hash()`` of a string changes with the process)."""
    keys = record.raw["dynamodb"]["Keys"]
    item = f"{keys['pk']['S']}\x00{keys['sk']['S']}"
    return zlib.crc32(item.encode()) % STREAM_PARALLELIZATION


@dataclass
class _Lane:
    """The records of the item keys that hash to one lane, and the event source's position,
    batch size and attempts in them."""

    number: int
    records: list[StreamRecord] = field(default_factory=list)
    position: int = 0
    busy: bool = False
    polling: bool = False
    attempts: int = 0
    batch: int = STREAM_BATCH  # halved after a failed invocation


class StreamSource:
    """The event source's lanes over the TTL stream; ``failures``: the records it gave up
    on (its on-failure destination); ``trimmed``: those the stream dropped before they were
    read; ``down``: when it cannot invoke the function, ``(from, until)``."""

    def __init__(self, world: World, ttl: Ttl, functions: Functions) -> None:
        self.world = world
        self.ttl = ttl
        self.functions = functions
        self.failures: list[dict[str, Any]] = []
        self.trimmed: list[dict[str, Any]] = []
        self.down: tuple[int, int] = (0, 0)
        self._lanes = [_Lane(n) for n in range(STREAM_PARALLELIZATION)]
        self._routed = 0  # the stream's records given to a lane so far

    def start(self) -> None:
        """Look at the stream a batching window after each TTL sweep that added records."""
        self.ttl.on_records = self._records_added

    def poll(self) -> None:
        """Invoke cleanup with the next batch of every lane that is not busy."""
        self._route()
        for lane in self._lanes:
            self._poll(lane)

    def _records_added(self) -> None:
        self._route()
        for lane in self._lanes:
            self._wake(lane, STREAM_WINDOW_MS)

    def _route(self) -> None:
        for record in self.ttl.stream[self._routed :]:
            self._lanes[lane_of(record)].records.append(record)
        self._routed = len(self.ttl.stream)

    def _wake(self, lane: _Lane, after_ms: int) -> None:
        """Look at a lane ``after_ms`` from now, unless a look or a batch is under way."""
        if lane.busy or lane.polling or lane.position >= len(lane.records):
            return
        lane.polling = True
        self.world.at(self.world.now_ms + after_ms, partial(self._poll, lane))

    def _poll(self, lane: _Lane) -> None:
        lane.polling = False
        if lane.busy or lane.position >= len(lane.records):
            return
        now = self.world.now_ms
        since, until = self.down
        if since <= now < until:  # throttled: retried (not counted) until it can invoke
            self.world.faults["cleanup-throttled"] += 1
            lane.polling = True
            self.world.at(until, partial(self._poll, lane))
            return
        self._trim(lane)
        if lane.position >= len(lane.records):
            return
        start = lane.position
        batch = lane.records[start : start + lane.batch]
        lane.busy = True
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
            lane.busy = False
            if ok and not failed:
                lane.position = start + len(batch)
                lane.attempts = 0
                lane.batch = STREAM_BATCH
                self._wake(lane, 0)
                return
            if ok:  # a partial batch response: the source resumes from the first failure
                lane.position = start + failed[0]
            else:  # the invocation failed: its batch is split for the retry
                lane.batch = max(1, len(batch) // 2)
            lane.attempts += 1
            if lane.attempts > STREAM_RETRIES:
                rest = lane.records[lane.position : start + len(batch)]
                self.failures.extend(r.raw for r in rest)
                self.world.faults["stream-on-failure"] += len(rest)
                lane.position = start + len(batch)
                lane.attempts = 0
                lane.batch = STREAM_BATCH
            self._wake(lane, STREAM_RETRY_MS)

        self.functions.invoke("cleanup", body, done)

    def _trim(self, lane: _Lane) -> None:
        """Skip the lane's unread records the stream no longer keeps."""
        oldest = self.world.now_ms - STREAM_RETENTION_MS
        first = lane.position
        while lane.position < len(lane.records) and lane.records[lane.position].at_ms < oldest:
            lane.position += 1
        if lane.position > first:
            gone = lane.records[first : lane.position]
            self.trimmed.extend(r.raw for r in gone)
            self.world.faults["stream-trimmed"] += len(gone)
            self.world.note(f"stream trimmed {len(gone)} unread records of lane {lane.number}")
            lane.attempts = 0
            lane.batch = STREAM_BATCH
