"""A wired pipeline on moto with a fake clock: real adapters, recorded SQS sends, fake Kafka."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from delayq import buckets
from delayq.direct import DirectServices
from delayq.emitter import EmitResult, EmitterServices, emit_batch, messages_from_event
from delayq.ingest import IngestResult, IngestServices, ingest_batch
from delayq.kafka import KafkaDelivery
from delayq.payloads import PayloadStore
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue, RejectQueue, SqsQueue, TickQueue
from delayq.retry import Deadline
from delayq.scheduler import ScheduleResult, run_scheduler
from delayq.settings import Settings
from delayq.shaping import Shaper
from delayq.stats import DeliveryStats, FlushPolicy
from delayq.store import MessageStore, Watermark
from testkit.aws import as_dynamodb_client, as_sqs_client
from testkit.clock import FakeClock, no_sleep_backoff
from testkit.kafka import FakeProducer
from tests.factories import AwsResources, RecordingSqs, SentEntry, sqs_event, store_of


@dataclass
class Pipeline:
    """Everything a test needs to drive ingest -> scheduler -> emitter by hand."""

    settings: Settings
    aws: AwsResources
    clock: FakeClock
    sqs: RecordingSqs
    store: MessageStore
    payloads: PayloadStore
    delay_queue: DelayQueue
    dead_letters: DelayQueue
    rejects: RejectQueue
    ticks: TickQueue
    producer: FakeProducer
    handed_over: set[int] = field(default_factory=set)
    stats: DeliveryStats = field(default_factory=DeliveryStats)
    shaper: Shaper | None = None
    # The pending counts ingest keeps (None: not kept, as with DELAYQ_PENDING_COUNTS=0).
    pending: PendingCounts | None = None

    def deadline(self) -> Deadline:
        return Deadline.after(60)

    def with_store_client(self, client: Any) -> Pipeline:
        """The same pipeline reading the table through another client (a recording proxy)."""
        return dataclasses.replace(self, store=store_of(client, self.settings))

    def ingest(
        self, event: object, *, direct: bool = False, delay_queue: DelayQueue | None = None
    ) -> IngestResult:
        """One ingest batch; ``direct``: with the direct path (producing to ``producer``)."""
        producer = self.producer
        direct_services = (
            DirectServices(
                KafkaDelivery(lambda _on_error: producer, 1.0),
                DeliveryStats(policy=FlushPolicy(max_messages=1)),
            )
            if direct
            else None
        )
        services = IngestServices(
            self.store,
            delay_queue or self.delay_queue,
            self.rejects,
            self.payloads,
            direct_services,
            shaper=self.shaper,
            pending=self.pending,
        )
        return ingest_batch(
            event,
            settings=self.settings,
            services=services,
            clock=self.clock,
            deadline=self.deadline(),
            sleep=self.clock.sleep,
        )

    def set_watermark(self, second: int) -> Watermark:
        """Put the scheduler's progress at ``second`` (created, or moved from where it is)."""
        mark = self.store.read_watermark(self.deadline())
        if mark is None:
            return self.store.create_watermark(second, self.clock(), self.deadline())
        return self.store.write_watermark(mark, Watermark(second), self.clock(), self.deadline())

    def pass_empty_seconds(self) -> None:
        """Move the watermark to just before the earliest stored message, as a scheduler that
        ran every minute would have: seconds before it are empty. Tests that jump the clock
        hours ahead then do not make the scheduler query thousands of empty seconds on moto."""
        items = self.aws.dynamodb.scan(TableName=self.settings.table_name)["Items"]
        dues = [int(i["due_ms"]["N"]) for i in items if i.get("kind", {}).get("S") == "msg"]
        mark = self.store.read_watermark(self.deadline())
        if not dues or mark is None:
            return
        target = buckets.due_second(min(dues)) - 2
        if target > mark.second:
            self.store.write_watermark(mark, Watermark(target), self.clock(), self.deadline())

    def schedule(self, deadline: Deadline | None = None) -> ScheduleResult:
        return run_scheduler(
            settings=self.settings,
            store=self.store,
            delay_queue=self.delay_queue,
            clock=self.clock,
            deadline=deadline or self.deadline(),
        )

    def emit(
        self,
        entries: list[SentEntry],
        receive_count: int = 1,
        receipt_handles: list[str] | None = None,
    ) -> EmitResult:
        services = self.emitter_services()
        event = sqs_event(entries, receive_count)
        for record, handle in zip(event["Records"], receipt_handles or [], strict=False):
            record["receiptHandle"] = handle
        return emit_batch(
            messages_from_event(event),
            settings=self.settings,
            services=services,
            clock=self.clock,
            sleep=self.clock.sleep,
            deadline=self.deadline(),
        )

    def emitter_services(self, *, delay_queue: DelayQueue | None = None) -> EmitterServices:
        """The emitter's adapters on this pipeline (``delay_queue`` replaces its own). Its
        release caps hold while catching up as in ``runtime.emitter_services``; each batch
        runs in a new container (no memory of full seconds)."""
        producer = self.producer
        limits = self.settings.limits
        return EmitterServices(
            KafkaDelivery(lambda _on_error: producer, 1.0),
            self.store,
            delay_queue or self.delay_queue,
            self.dead_letters,
            self.rejects,
            self.payloads,
            self.stats,
            Shaper(self.store, limits) if self.settings.strict_caps and limits.any else None,
        )

    def delayed(self) -> list[SentEntry]:
        return self.sqs.to(self.settings.delay_queue_url)

    def dead_lettered(self) -> list[SentEntry]:
        """What the emitter sent to the delay queue's dead-letter queue."""
        return self.sqs.to(self.settings.delay_dlq_url)

    def deliver_released(self, until_ms: int | None = None) -> EmitResult:
        """Emit the recorded delay-queue entries not emitted yet that SQS releases up to
        ``until_ms`` (default: all), as the poller would: at each release time, a batch of
        at most 10 of the entries visible by then. Batches run as concurrent invocations
        would: each starts at its own release time, not after the previous one's holds."""
        total = EmitResult()
        waiting = sorted(
            (
                e
                for e in self.delayed()
                if id(e) not in self.handed_over and (until_ms is None or e.release_ms <= until_ms)
            ),
            key=lambda e: e.release_ms,
        )
        latest = self.clock.now_ms
        while waiting:
            self.clock.now_ms = waiting[0].release_ms
            visible = [e for e in waiting if e.release_ms <= self.clock.now_ms][:10]
            waiting = waiting[len(visible) :]
            self.handed_over.update(id(e) for e in visible)
            result = self.emit(visible)
            latest = max(latest, self.clock.now_ms)
            total.failed += result.failed
            total.deliveries += result.deliveries
            total.cancelled += result.cancelled
            total.redelayed += result.redelayed
            total.requeued += result.requeued
            total.dead_lettered += result.dead_lettered
            total.rejected += result.rejected
            total.errors += result.errors
        self.clock.now_ms = latest
        return total


@pytest.fixture
def pipeline(aws: AwsResources, clock: FakeClock) -> Pipeline:
    # Compressed time (as the local stack runs it) keeps each scheduler window small.
    s = aws.settings.with_overrides(horizon_seconds=300, lookahead_seconds=240)
    sqs = RecordingSqs(aws.sqs, clock)
    backoff = no_sleep_backoff()
    store = store_of(aws.dynamodb, s)
    payloads = PayloadStore(aws.s3, s.payload_bucket, backoff)
    return Pipeline(
        settings=s,
        aws=aws,
        clock=clock,
        sqs=sqs,
        store=store,
        payloads=payloads,
        delay_queue=DelayQueue(
            SqsQueue(as_sqs_client(sqs), s.delay_queue_url, backoff), s.emit_lead_ms
        ),
        dead_letters=DelayQueue(
            SqsQueue(as_sqs_client(sqs), s.delay_dlq_url, backoff), s.emit_lead_ms
        ),
        rejects=RejectQueue(SqsQueue(as_sqs_client(sqs), s.reject_queue_url, backoff), payloads),
        ticks=TickQueue(as_sqs_client(sqs), s.tick_queue_url, backoff),
        producer=FakeProducer(clock=clock),
        pending=PendingCounts(as_dynamodb_client(aws.dynamodb), s.table_name, backoff=backoff),
    )


@pytest.fixture
def indexed(pipeline: Pipeline) -> Pipeline:
    """The pipeline with the id index on (``DELAYQ_ID_INDEX=1``)."""
    settings = pipeline.settings.with_overrides(id_index=1)
    return dataclasses.replace(
        pipeline, settings=settings, store=store_of(pipeline.aws.dynamodb, settings)
    )


@pytest.fixture
def p(pipeline: Pipeline) -> Pipeline:
    """The pipeline under the short name most functional tests use."""
    return pipeline
