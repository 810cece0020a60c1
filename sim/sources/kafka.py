"""Kafka -> ingest: per partition, one batch at a time, in order; a batch whose invocation
fails or dies is retried whole (its records are acknowledged only when it succeeds), from
its first offset with the records there by then (up to the batch size), so a retry may hold
more records than the first attempt. A batch that succeeded may come again the same way
(``Knobs.kafka_redeliver``: its offsets were not committed; more often in a run whose consumer
group keeps rebalancing). A batch
that ingest fails with a programming error (not an AWS or delay-queue error) three times in a
row blocks its partition for good, as it would on AWS: the run records it (the checker's
``stuck``) and stops retrying it, so that the seed ends with its story instead of retrying to
the end of the run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError
from confluent_kafka import KafkaException

from delayq.exceptions import DelayQueueError
from delayq.ingest import ingest_batch
from delayq.settings import Settings
from sim.faults import Knobs
from sim.functions import Container, Functions
from sim.workload import PARTITIONS
from sim.world import Invocation, World
from testkit.events import kafka_event

# From template.yaml: the ingest event source's BatchSize and batching window.
INGEST_BATCH: Final = 100
INGEST_WINDOW_MS: Final = 500
# Failures of one batch by the same kind of bug before its partition counts as blocked.
STUCK_AFTER: Final = 3


@dataclass
class Stuck:
    """A partition ingest can no longer pass: the first offset of the batch it keeps failing,
    and what it raised."""

    partition: int
    offset: int
    error: str
    at_ms: int


def is_bug(error: Exception | None) -> bool:
    """Whether a failed invocation raised what no retry fixes (not an AWS error, not the
    layer's own ``DelayQueueError``, not a crash or a timeout)."""
    return error is not None and not isinstance(
        error, DelayQueueError | ClientError | BotoCoreError | KafkaException
    )


@dataclass
class Acked:
    """A delay-topic record whose batch ingest acknowledged (its offset committed)."""

    record: dict[str, Any]
    at_ms: int


@dataclass
class Partition:
    """One partition of the delay topic and the event source's position in it."""

    number: int
    records: list[dict[str, Any]] = field(default_factory=list)
    committed: int = 0
    acked: int = 0  # the offset before which every record was acknowledged once
    busy: bool = False
    polling: bool = False
    # Consecutive failures of the batch at ``committed`` by a bug (``is_bug``).
    bugs: int = 0
    stuck: bool = False


class KafkaSource:
    """The delay topic's partitions, the records ingest acknowledged, and the stalls the run
    planted: ``(partition, from, until)``, while which the event source does not poll it."""

    def __init__(
        self, world: World, knobs: Knobs, settings: Settings, functions: Functions
    ) -> None:
        self.world = world
        self.knobs = knobs
        rebalancing = world.stream("kafka").random() < knobs.kafka_rebalancing
        self.redeliver = knobs.kafka_rebalancing_redeliver if rebalancing else knobs.kafka_redeliver
        self.settings = settings
        self.functions = functions
        self.partitions = [Partition(n) for n in range(PARTITIONS)]
        self.acked: list[Acked] = []
        # How many ingest invocations each record (partition, offset) was given to.
        self.attempts: Counter[tuple[int, int]] = Counter()
        self.stalls: list[tuple[int, int, int]] = []
        self.stuck: list[Stuck] = []

    def write(self, partition: int, record: dict[str, Any]) -> None:
        """A producer writes a record to the delay topic (the broker assigns its offset)."""
        p = self.partitions[partition]
        p.records.append({**record, "partition": partition, "offset": len(p.records)})
        self._poll_partition(p, INGEST_WINDOW_MS)

    def _poll_partition(self, p: Partition, after_ms: int) -> None:
        if p.busy or p.polling or p.stuck or p.committed >= len(p.records):
            return
        p.polling = True
        self.world.at(self.world.now_ms + after_ms, lambda: self._ingest(p))

    def _ingest(self, p: Partition) -> None:
        p.polling = False
        if p.busy or p.committed >= len(p.records):
            return
        now = self.world.now_ms
        stalled = [
            until for n, since, until in self.stalls if n == p.number and since <= now < until
        ]
        if stalled:
            self.world.faults["ingest-stalled"] += 1
            self._poll_partition(p, max(stalled) - now)
            return
        batch = p.records[p.committed : p.committed + INGEST_BATCH]
        p.busy = True
        self.attempts.update((p.number, r["offset"]) for r in batch)

        def body(cn: Container, invocation: Invocation) -> None:
            ingest_batch(
                kafka_event(*batch),
                settings=self.settings,
                services=cn.ingest_services(),
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
                sleep=self.world.sleep,
            )

        def done(ok: bool) -> None:
            p.busy = False
            if ok:
                p.bugs = 0
                self.acked.extend(
                    Acked(r, self.world.now_ms) for r in batch if r["offset"] >= p.acked
                )
                p.acked = max(p.acked, p.committed + len(batch))
                if self.redeliver > 0 and self.world.stream("kafka").random() < self.redeliver:
                    self.world.faults["kafka-redelivered"] += 1
                    self.world.note(f"delay-requests-{p.number} redelivers from {p.committed}")
                    self._poll_partition(p, self.world.stream("kafka").randint(500, 30_000))
                    return
                p.committed += len(batch)
                self._poll_partition(p, 0)
                return
            error = self.functions.last_failure
            p.bugs = p.bugs + 1 if is_bug(error) else 0
            if p.bugs >= STUCK_AFTER:
                p.stuck = True
                found = Stuck(p.number, p.committed, repr(error), self.world.now_ms)
                self.stuck.append(found)
                self.world.note(f"delay-requests-{p.number} blocked at {p.committed}: {error!r}")
                return
            self._poll_partition(p, self.world.rng.randint(500, 3000))

        self.functions.invoke("ingest", body, done)
