"""Kafka -> ingest: per partition, one batch at a time, in order; a batch whose invocation
fails or dies is retried whole (its records are acknowledged only when it succeeds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from delayq.direct import DirectServices
from delayq.ingest import IngestServices, ingest_batch
from delayq.settings import Settings
from sim.functions import Container, Functions
from sim.workload import PARTITIONS
from sim.world import Invocation, World
from testkit.events import kafka_event

# From template.yaml: the ingest event source's BatchSize and batching window.
INGEST_BATCH: Final = 100
INGEST_WINDOW_MS: Final = 500


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
    busy: bool = False
    polling: bool = False


class KafkaSource:
    """The delay topic's partitions, the records ingest acknowledged, and the stalls the run
    planted: ``(partition, from, until)``, while which the event source does not poll it."""

    def __init__(self, world: World, settings: Settings, functions: Functions) -> None:
        self.world = world
        self.settings = settings
        self.functions = functions
        self.partitions = [Partition(n) for n in range(PARTITIONS)]
        self.acked: list[Acked] = []
        self.stalls: list[tuple[int, int, int]] = []

    def write(self, partition: int, record: dict[str, Any]) -> None:
        """A producer writes a record to the delay topic (the broker assigns its offset)."""
        p = self.partitions[partition]
        p.records.append({**record, "partition": partition, "offset": len(p.records)})
        self._poll_partition(p, INGEST_WINDOW_MS)

    def _poll_partition(self, p: Partition, after_ms: int) -> None:
        if p.busy or p.polling or p.committed >= len(p.records):
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

        def body(cn: Container, invocation: Invocation) -> None:
            services = IngestServices(
                cn.store,
                cn.delay_queue,
                cn.rejects,
                cn.payloads,
                direct=DirectServices(cn.delivery, cn.stats),
                shaper=cn.shaper,
                pending=cn.pending,
            )
            ingest_batch(
                kafka_event(*batch),
                settings=self.settings,
                services=services,
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
                sleep=self.world.sleep,
            )

        def done(ok: bool) -> None:
            p.busy = False
            if ok:
                p.committed += len(batch)
                self.acked.extend(Acked(r, self.world.now_ms) for r in batch)
                self._poll_partition(p, 0)
            else:
                self._poll_partition(p, self.world.rng.randint(500, 3000))

        self.functions.invoke("ingest", body, done)
