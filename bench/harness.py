"""The real services (``delayq.ingest``, ``delayq.scheduler``, ``delayq.emitter``) wired to
the in-memory clients of :mod:`testkit.aws`, with a clock that only moves when told.

:class:`InMemoryPipeline` also models the Lambda SQS event source explicitly: it receives up
to 10 messages a call (``ReceiveMessage``), invokes the emitter, and deletes what the emitter
did not report as failed (``DeleteMessageBatch``), on the same fake SQS client, so those calls
are counted like the ones the handlers make.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from bench.reference_mix import ALLOWED_TARGETS, sqs_record
from bench.template import deployed
from delayq.emitter import EmitResult, EmitterServices, emit_batch, messages_from_event
from delayq.ingest import IngestResult, IngestServices, ingest_batch
from delayq.kafka import KafkaDelivery
from delayq.payloads import PayloadStore
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue, RejectQueue, SqsQueue
from delayq.retry import Deadline
from delayq.scheduler import ScheduleResult, run_scheduler
from delayq.settings import Settings
from delayq.stats import DeliveryStats
from delayq.store import MessageStore, query_pool
from testkit.aws import (
    FakeDynamoDB,
    FakeS3,
    FakeSqs,
    RequestCounter,
    as_dynamodb_client,
    as_s3_client,
    as_sqs_client,
)
from testkit.clock import NOW_MS, FakeClock, no_sleep_backoff
from testkit.kafka import FakeProducer
from testkit.services import message_store

TABLE: Final = "delayq-messages"
BUCKET: Final = "delayq-payloads"
# Lambda's SQS event source: at most 10 messages per ReceiveMessage and 10 entries per
# DeleteMessageBatch; the emitter's BatchSize comes from template.yaml. The visibility timeout
# of the delay queue.
SQS_RECEIVE_MAX: Final = 10
VISIBILITY_TIMEOUT_S: Final = 180


def bench_settings(**overrides: Any) -> Settings:
    """The layer's defaults (AWS periods, 16 shards) with in-memory resource names."""
    values: dict[str, Any] = {
        "table_name": TABLE,
        "delay_queue_url": "",
        "tick_queue_url": "",
        "reject_queue_url": "",
        "payload_bucket": BUCKET,
        "allowed_targets": ALLOWED_TARGETS,
        "kafka_bootstrap": "in-memory:9092",
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Invocations:
    """Lambda invocations the pipeline made, by function."""

    ingest: int = 0
    scheduler: int = 0
    emitter: int = 0

    def as_dict(self) -> dict[str, int]:
        """For reports."""
        return {"ingest": self.ingest, "scheduler": self.scheduler, "emitter": self.emitter}


@dataclass
class InMemoryPipeline:
    """Ingest, scheduler and emitter on in-memory AWS and Kafka; one shared request counter."""

    settings: Settings
    clock: FakeClock
    counter: RequestCounter
    dynamodb: FakeDynamoDB
    sqs: FakeSqs
    s3: FakeS3
    producer: FakeProducer
    store: MessageStore
    payloads: PayloadStore
    delay_queue: DelayQueue
    dead_letters: DelayQueue
    rejects: RejectQueue
    stats: DeliveryStats
    executor: ThreadPoolExecutor  # the store's parallel queries (closed by close())
    # The pending counts ingest keeps (None when the settings turn them off).
    pending: PendingCounts | None = None
    invocations: Invocations = field(default_factory=Invocations)

    @classmethod
    def create(
        cls, settings: Settings | None = None, *, keep_records: bool = False, now_ms: int = NOW_MS
    ) -> InMemoryPipeline:
        """A fresh, empty world: table, queues, bucket, producer, clock at ``now_ms``."""
        clock = FakeClock(now_ms)
        counter = RequestCounter()
        dynamodb = FakeDynamoDB(counter)
        dynamodb.create_table(TABLE)
        sqs = FakeSqs(counter, clock)
        delay_url = sqs.create_queue(QueueName="delayq-delay")["QueueUrl"]
        dlq_url = sqs.create_queue(QueueName="delayq-delay-dlq")["QueueUrl"]
        reject_url = sqs.create_queue(QueueName="delayq-reject")["QueueUrl"]
        tick_url = sqs.create_queue(QueueName="delayq-tick.fifo")["QueueUrl"]
        s3 = FakeS3(counter)
        s3.create_bucket(Bucket=BUCKET)
        s = (settings or bench_settings()).with_overrides(
            delay_queue_url=delay_url,
            reject_queue_url=reject_url,
            tick_queue_url=tick_url,
            delay_dlq_url=dlq_url,
        )
        backoff = no_sleep_backoff()
        executor = query_pool(s.shards)
        store = message_store(dynamodb, s, backoff, executor)
        payloads = PayloadStore(as_s3_client(s3), s.payload_bucket, backoff)
        return cls(
            settings=s,
            clock=clock,
            counter=counter,
            dynamodb=dynamodb,
            sqs=sqs,
            s3=s3,
            producer=FakeProducer(counter, keep=keep_records, clock=clock),
            store=store,
            payloads=payloads,
            delay_queue=DelayQueue(
                SqsQueue(as_sqs_client(sqs), s.delay_queue_url, backoff), s.emit_lead_ms
            ),
            dead_letters=DelayQueue(
                SqsQueue(as_sqs_client(sqs), s.delay_dlq_url, backoff), s.emit_lead_ms
            ),
            rejects=RejectQueue(
                SqsQueue(as_sqs_client(sqs), s.reject_queue_url, backoff), payloads
            ),
            stats=DeliveryStats(instance_id="bench"),
            executor=executor,
            pending=PendingCounts(as_dynamodb_client(dynamodb), TABLE, backoff=backoff)
            if s.pending_counts
            else None,
        )

    def close(self) -> None:
        """Stop the store's query threads."""
        self.executor.shutdown(wait=False)

    def deadline(self) -> Deadline:
        """A generous deadline: the in-memory calls never take long."""
        return Deadline.after(3600)

    # The three services, as the handlers call them ------------------------------------

    def ingest(self, event: Any) -> IngestResult:
        """One ingest invocation."""
        self.invocations.ingest += 1
        services = IngestServices(
            self.store, self.delay_queue, self.rejects, self.payloads, pending=self.pending
        )
        return ingest_batch(
            event,
            settings=self.settings,
            services=services,
            clock=self.clock,
            deadline=self.deadline(),
        )

    def schedule(self) -> ScheduleResult:
        """One scheduler invocation (a tick)."""
        self.invocations.scheduler += 1
        return run_scheduler(
            settings=self.settings,
            store=self.store,
            delay_queue=self.delay_queue,
            clock=self.clock,
            deadline=self.deadline(),
        )

    def emitter_services(self) -> EmitterServices:
        """What one emitter execution environment holds."""
        producer = self.producer
        return EmitterServices(
            delivery=KafkaDelivery(lambda _on_error: producer, self.settings.kafka_timeout_seconds),
            store=self.store,
            delay_queue=self.delay_queue,
            dead_letters=self.dead_letters,
            rejects=self.rejects,
            payloads=self.payloads,
            stats=self.stats,
        )

    def emit(self, event: Any, services: EmitterServices | None = None) -> EmitResult:
        """One emitter invocation on an SQS event."""
        self.invocations.emitter += 1
        return emit_batch(
            messages_from_event(event),
            settings=self.settings,
            services=services or self.emitter_services(),
            clock=self.clock,
            sleep=self.clock.sleep,
            deadline=self.deadline(),
        )

    # The Lambda SQS event source, modelled on the fake queue -------------------------------

    def poll_delay_queue(self, batch: int | None = None) -> int:
        """Deliver every message visible now, as the event source does: ``ReceiveMessage``
        (10 at most) until ``batch`` messages (default: the template's BatchSize) or none is
        left, the emitter, then ``DeleteMessageBatch`` (10 a call) of the successful ones.
        Returns how many messages were received."""
        url = self.settings.delay_queue_url
        size = batch or deployed().emitter_batch_size
        services = self.emitter_services()
        received = 0
        while True:
            got: list[dict[str, Any]] = []
            while len(got) < size:
                more = self.sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=min(SQS_RECEIVE_MAX, size - len(got)),
                    VisibilityTimeout=VISIBILITY_TIMEOUT_S,
                    WaitTimeSeconds=20,
                    AttributeNames=["All"],
                ).get("Messages", [])
                if not more:
                    break
                got.extend(more)
            if not got:
                return received
            received += len(got)
            records = [
                {
                    **sqs_record(0, m["Body"], int(m["Attributes"]["ApproximateReceiveCount"])),
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                }
                for m in got
            ]
            result = self.emit({"Records": records}, services)
            failed = set(result.failed)
            done = [m for m in got if m["MessageId"] not in failed]
            for start in range(0, len(done), SQS_RECEIVE_MAX):
                self.sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(done[start : start + SQS_RECEIVE_MAX])
                    ],
                )
