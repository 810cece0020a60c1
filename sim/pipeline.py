"""The whole pipeline on the simulated world: the real layer services (ingest, timer,
scheduler, emitter, cleanup) behind models of the Lambda event sources that invoke them.

Event sources, as AWS documents them:

- Kafka (ingest): per partition, one batch at a time, in order; a batch whose invocation
  fails or dies is retried whole (its records are acknowledged only when it succeeds).
- EventBridge (timer): one event per period, late within the period, sometimes missed or
  twice; a failed asynchronous invocation is retried twice.
- SQS FIFO (scheduler): one tick at a time; a failed tick comes back after the visibility
  timeout, and goes to the dead-letter queue after ``maxReceiveCount`` receives.
- SQS standard (emitter): batches of up to 100 after a batching window, several invocations at
  once, partial batch responses; a crashed batch comes back after the visibility timeout; a
  message received more than ``maxReceiveCount`` times moves to the dead-letter queue; a
  deleted message may come again (at-least-once).
- DynamoDB stream (cleanup): in order, at least once; a failed record is retried with the
  rest of the batch after it, up to ``MaximumRetryAttempts``, then the batch goes to the
  on-failure destination.

Each function runs in containers (one per concurrent invocation, reused), each with its own
clients, producer and clock skew, like Lambda's execution environments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from delayq.cleanup import CleanupServices, TtlCleanup
from delayq.direct import DirectServices
from delayq.emitter import EmitterServices, emit_batch, messages_from_event
from delayq.ingest import IngestServices, ingest_batch
from delayq.kafka import KafkaDelivery
from delayq.payloads import PayloadStore
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue, RejectQueue, SqsQueue, TickQueue
from delayq.retry import Backoff
from delayq.scheduler import fire_timer, run_scheduler
from delayq.settings import Settings
from delayq.shaping import Shaper
from delayq.stats import DeliveryStats
from delayq.store import MessageStore
from sim.aws import ReplicatedDynamoDB, SimProducer, TargetCluster, Ttl
from sim.faults import DriftingClock, Faulty, Knobs, RetryLedger
from sim.iam import Roles, roles
from sim.workload import PARTITIONS
from sim.world import Crash, Invocation, World
from testkit.aws import (
    FakeS3,
    FakeSqs,
    RequestCounter,
    as_dynamodb_client,
    as_s3_client,
    as_sqs_client,
)
from testkit.clock import SerialExecutor
from testkit.events import kafka_event, queue_arn, sqs_record
from testkit.services import message_store

DELAY_TOPIC: Final = "delay-requests"
ALLOWED: Final = ("orders.*", "reminders")

# From template.yaml (timeouts, batch sizes, visibility timeouts, receive counts, retries).
TIMEOUT_S: Final = {"ingest": 60, "timer": 10, "scheduler": 60, "emitter": 30, "cleanup": 60}
INGEST_BATCH: Final = 100
INGEST_WINDOW_MS: Final = 500
EMITTER_BATCH: Final = 100
EMITTER_WINDOW_MS: Final = 1000
EMITTER_CONCURRENCY: Final = 5
DELAY_VISIBILITY_S: Final = 180
DELAY_MAX_RECEIVES: Final = 10
TICK_VISIBILITY_S: Final = 360
TICK_MAX_RECEIVES: Final = 5
TIMER_RETRIES: Final = 2
# The cleanup function's stream event source (template.yaml): BatchSize, the batching window,
# MaximumRetryAttempts; a failed invocation halves the batch it retries
# (BisectBatchOnFunctionError); a partial batch response resumes from the first failed record.
STREAM_BATCH: Final = 500
STREAM_WINDOW_MS: Final = 5000
STREAM_RETRIES: Final = 10
STREAM_RETRY_MS: Final = 1000


def sim_settings(roles: Roles, **overrides: Any) -> Settings:
    """AWS's periods (15-minute horizon, 1-minute tick), with a TTL grace short enough that
    a run reaches it (the scheduler outage knob is longer); the resources the template names."""
    names = roles.names
    values: dict[str, Any] = {
        "table_name": names["MessageTable"],
        "payload_bucket": names["PayloadBucket"],
        "delay_queue_url": names["DelayQueue"],
        "delay_dlq_url": names["DelayDeadLetterQueue"],
        "reject_queue_url": names["RejectQueue"],
        "tick_queue_url": names["TickQueue"],
        "allowed_targets": ALLOWED,
        "kafka_bootstrap": "sim:9092",
        "shards": 4,
        "ttl_grace_seconds": 1800,
        "ttl_clock_margin_seconds": 60,
        "stats_flush_messages": 1000,
    }
    values.update(overrides)
    return Settings(**values)


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


class _Containers:
    """A function's execution environments: one per concurrent invocation, reused."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._idle: list[Any] = []

    def take(self) -> Any:
        return self._idle.pop() if self._idle else self._build()

    def give_back(self, container: Any) -> None:
        self._idle.append(container)


@dataclass
class _Container:
    """One execution environment: clients (faulty), adapters, a producer, a skewed clock."""

    clock: Callable[[], int]
    store: MessageStore
    payloads: PayloadStore
    delay_queue: DelayQueue
    dead_letters: DelayQueue
    rejects: RejectQueue
    tick_queue: TickQueue
    delivery: KafkaDelivery
    stats: DeliveryStats
    pending: PendingCounts
    # The tenant limits' counters (None: no tenant has a limit), as ``delayq.runtime`` has
    # them: ingest's release slots and quotas, the emitter's slots for late capped messages.
    shaper: Shaper | None


@dataclass(frozen=True)
class SchedulerRun:
    """A scheduler run that returned: when it started and ended, and the last due-second it
    had released (its watermark) when it ended."""

    started_ms: int
    ended_ms: int
    watermark: int


class Pipeline:
    """The world, the AWS resources, the five functions and their event sources."""

    def __init__(self, world: World, knobs: Knobs, settings: Settings | None = None) -> None:
        self.world = world
        self.knobs = knobs
        self.roles = roles()
        self.settings = s = settings or sim_settings(self.roles)
        self.counter = RequestCounter()
        self.dynamodb = ReplicatedDynamoDB(world, knobs, self.counter)
        self.dynamodb.create_table(s.table_name)
        self.sqs = FakeSqs(self.counter, world.clock)
        for url in (s.delay_queue_url, s.delay_dlq_url, s.reject_queue_url, s.tick_queue_url):
            created = self.sqs.create_queue(QueueName=url.rsplit("/", 1)[-1])["QueueUrl"]
            if created != url:
                raise ValueError(f"queue {url} would be created as {created}")
        self.s3 = FakeS3(self.counter)
        self.s3.create_bucket(Bucket=s.payload_bucket)
        self.ttl = Ttl(world, knobs, self.dynamodb, s.table_name)
        self.cluster = TargetCluster()
        self.partitions = [Partition(n) for n in range(PARTITIONS)]
        self.acked: list[Acked] = []
        self.cleanup_failures: list[dict[str, Any]] = []  # the stream's on-failure destination
        self.scheduler_down: tuple[int, int] = (0, 0)
        self.ingest_stalls: list[tuple[int, int, int]] = []  # (partition, from, until)
        self.scheduler_runs: list[SchedulerRun] = []  # the runs that returned
        self.retries = RetryLedger()  # transient errors the invocations have not retried yet
        self.ingest_behind_ms = 0
        self.invocations: dict[str, int] = dict.fromkeys(TIMEOUT_S, 0)
        self._containers = {f: _Containers(partial(self._container, f)) for f in TIMEOUT_S}
        self._emitters = 0
        self._polls: dict[str, int] = {}  # queue URL -> when its event source looks next
        self._ticking = False
        self._stream_position = 0
        self._stream_busy = False
        self._stream_polling = False
        self._stream_attempts = 0
        self._stream_batch = STREAM_BATCH  # halved after a failed invocation

    # --- set-up ---------------------------------------------------------------------------

    def _container(self, function: str) -> _Container:
        world, knobs, s = self.world, self.knobs, self.settings
        serial = SerialExecutor()
        backoff = Backoff(rng=world.rng, sleep=world.sleep)
        guard = self.roles.guard
        ledger = self.retries
        sqs = Faulty(_Notifying(self.sqs, self._sent), world, knobs, "sqs", guard, ledger=ledger)
        dynamodb = Faulty(self.dynamodb, world, knobs, "dynamodb", guard, ledger=ledger)
        s3 = Faulty(self.s3, world, knobs, "s3", guard, ledger=ledger)
        # Each execution environment's clock is off by its own, drifting, amount.
        clock = DriftingClock(world, knobs, self.ingest_behind_ms if function == "ingest" else 0)
        store = message_store(dynamodb, s, backoff, serial)
        payloads = PayloadStore(as_s3_client(s3), s.payload_bucket, backoff, executor=serial)
        producer = SimProducer(world, knobs, self.cluster, function)

        def queue(url: str) -> SqsQueue:
            return SqsQueue(as_sqs_client(sqs), url, backoff, executor=serial)

        return _Container(
            clock=clock,
            store=store,
            payloads=payloads,
            delay_queue=DelayQueue(queue(s.delay_queue_url), s.emit_lead_ms),
            dead_letters=DelayQueue(queue(s.delay_dlq_url), s.emit_lead_ms),
            rejects=RejectQueue(queue(s.reject_queue_url), payloads),
            tick_queue=TickQueue(as_sqs_client(sqs), s.tick_queue_url),
            delivery=KafkaDelivery(lambda _on_error: producer, s.kafka_timeout_seconds),
            stats=DeliveryStats(instance_id=f"sim-{function}"),
            pending=PendingCounts(as_dynamodb_client(dynamodb), s.table_name, backoff=backoff),
            shaper=self._shaper(function, store),
        )

    def _shaper(self, function: str, store: MessageStore) -> Shaper | None:
        limits = self.settings.limits
        if not limits.any or (function == "emitter" and not self.settings.strict_caps):
            return None
        return Shaper(store, limits)

    def start(self, until_ms: int) -> None:
        """Start the periodic sources: EventBridge's ticks until ``until_ms``, TTL sweeps."""
        self.ttl.on_records = lambda: self._wake_stream(STREAM_WINDOW_MS)
        self.ttl.start()
        period = self.settings.tick_seconds * 1000
        first = (self.world.now_ms // period + 1) * period
        for start in range(first, until_ms, period):
            self._schedule_tick(start)

    def _invoke(
        self,
        function: str,
        body: Callable[[_Container, Invocation], None],
        done: Callable[[bool], None],
    ) -> None:
        """Run ``body`` in a container of ``function``; ``done(ok)`` settles the event. Lambda
        may throttle the invocation (no concurrency left): it never runs, and the event source
        retries as it does after a failure."""
        if self.world.chance(self.knobs.lambda_throttled, "lambda-throttled"):
            self.world.note(f"{function} invocation throttled")
            self.world.at(self.world.now_ms, lambda: done(False))
            return
        self.invocations[function] += 1
        containers = self._containers[function]
        container = containers.take()

        def run(invocation: Invocation) -> None:
            ok = alive = False
            try:
                body(container, invocation)
                self.world.check_alive()
                ok = alive = True
            except Crash as e:
                self.world.note(f"{function} #{invocation.number} died: {e}")
            except Exception as e:  # noqa: BLE001 -- the invocation failed: the source retries
                self.world.note(f"{function} #{invocation.number} failed: {type(e).__name__}: {e}")
                alive = True
            self.retries.ended(invocation, killed=not alive)
            if alive:  # a dead process takes its container with it
                containers.give_back(container)
            done(ok)

        self.world.invoke(function, TIMEOUT_S[function], run)

    # --- Kafka -> ingest ------------------------------------------------------------------

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

    @property
    def clock_offset_ms(self) -> int:
        """How far apart two functions' clocks may be in this run, beyond the normal skew."""
        return self.ingest_behind_ms

    def _ingest(self, p: Partition) -> None:
        p.polling = False
        if p.busy or p.committed >= len(p.records):
            return
        now = self.world.now_ms
        stalled = [
            until
            for n, since, until in self.ingest_stalls
            if n == p.number and since <= now < until
        ]
        if stalled:
            self.world.faults["ingest-stalled"] += 1
            self._poll_partition(p, max(stalled) - now)
            return
        batch = p.records[p.committed : p.committed + INGEST_BATCH]
        p.busy = True

        def body(cn: _Container, invocation: Invocation) -> None:
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

        self._invoke("ingest", body, done)

    # --- EventBridge -> timer -> tick queue -> scheduler ----------------------------------

    def _schedule_tick(self, period_start_ms: int) -> None:
        world, knobs = self.world, self.knobs
        if world.chance(knobs.tick_missed, "tick-missed"):
            return
        copies = 2 if world.chance(knobs.tick_duplicated, "tick-duplicated") else 1
        for _ in range(copies):
            late = world.rng.randint(0, knobs.tick_late_ms) if knobs.tick_late_ms else 0
            world.at(period_start_ms + late, lambda: self._timer(TIMER_RETRIES))

    def _timer(self, retries_left: int) -> None:
        def body(cn: _Container, invocation: Invocation) -> None:
            fire_timer(
                tick_queue=cn.tick_queue,
                settings=self.settings,
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
            )

        def done(ok: bool) -> None:
            if not ok and retries_left:
                # Asynchronous invocation: retried after a minute, then two.
                wait = 60_000 * (TIMER_RETRIES - retries_left + 1)
                self.world.at(self.world.now_ms + wait, lambda: self._timer(retries_left - 1))

        self._invoke("timer", body, done)

    def _poll_ticks(self) -> None:
        if self._ticking:
            return
        url = self.settings.tick_queue_url
        if not self._poller_may("scheduler", "ReceiveMessage", url):
            return
        got = self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=TICK_VISIBILITY_S
        )
        messages = got.get("Messages", [])
        if not messages:
            self._wake(url, self._poll_ticks)
            return
        message = messages[0]
        if int(message["Attributes"]["ApproximateReceiveCount"]) > TICK_MAX_RECEIVES:
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            self.world.faults["tick-dead-lettered"] += 1
            self.world.at(self.world.now_ms, self._poll_ticks)
            return
        self._ticking = True

        def body(cn: _Container, invocation: Invocation) -> None:
            start, end = self.scheduler_down
            if start <= self.world.now_ms < end:
                self.world.faults["scheduler-down"] += 1
                raise RuntimeError("the scheduler is down (outage knob)")
            result = run_scheduler(
                settings=self.settings,
                store=cn.store,
                delay_queue=cn.delay_queue,
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
            )
            if result.watermark_after is not None:
                run = SchedulerRun(invocation.started_ms, self.world.now_ms, result.watermark_after)
                self.scheduler_runs.append(run)

        def done(ok: bool) -> None:
            self._ticking = False
            if ok and self._poller_may("scheduler", "DeleteMessage", url):
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            self.world.at(self.world.now_ms, self._poll_ticks)

        self._invoke("scheduler", body, done)

    # --- delay queue -> emitter -----------------------------------------------------------

    def _poller_may(self, function: str, operation: str, url: str) -> bool:
        """Lambda's pollers call SQS with the function's execution role: IAM checks them too
        (a refused poll leaves the messages where they are)."""
        denial = self.roles.guard.check(function, "sqs", operation, {"QueueUrl": url})
        if denial is not None:
            self.world.faults["iam-denied"] += 1
        return denial is None

    def _sent(self, url: str) -> None:
        """Something was sent to ``url``: its event source looks again when it is visible."""
        if url == self.settings.delay_queue_url:
            self._wake(url, self._poll_delay_queue, EMITTER_WINDOW_MS)
        elif url == self.settings.tick_queue_url:
            self._wake(url, self._poll_ticks)

    def _wake(self, url: str, poll: Callable[[], None], window_ms: int = 0) -> None:
        """The event source looks at ``url`` again when its next message becomes visible
        (after a batching window): one pending look per queue, the earliest needed."""
        visible = self.sqs.next_visible_ms(url)
        if visible is None:
            return
        when = max(visible, self.world.now_ms) + (
            self.world.rng.randint(0, window_ms) if window_ms else 0
        )
        pending = self._polls.get(url)
        if pending is not None and pending <= when:
            return
        self._polls[url] = when
        self.world.at(when, partial(self._looked, url, when, poll))

    def _looked(self, url: str, when: int, poll: Callable[[], None]) -> None:
        if self._polls.get(url) == when:
            del self._polls[url]
        poll()

    def _poll_delay_queue(self) -> None:
        url = self.settings.delay_queue_url
        if self._emitters >= EMITTER_CONCURRENCY:
            return  # a finishing invocation polls again
        if not self._poller_may("emitter", "ReceiveMessage", url):
            return
        got: list[dict[str, Any]] = []
        while len(got) < EMITTER_BATCH:
            more = self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=DELAY_VISIBILITY_S
            ).get("Messages", [])
            if not more:
                break
            for m in more:
                if int(m["Attributes"]["ApproximateReceiveCount"]) > DELAY_MAX_RECEIVES:
                    # The queue's redrive policy: to the dead-letter queue, as it is.
                    self.sqs.send_message(
                        QueueUrl=self.settings.delay_dlq_url, MessageBody=m["Body"]
                    )
                    self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    self.world.faults["sqs-redrive-to-dlq"] += 1
                else:
                    got.append(m)
        if not got:
            self._wake(url, self._poll_delay_queue, EMITTER_WINDOW_MS)
            return
        self._emitters += 1
        records = [
            sqs_record(
                message_id=m["MessageId"],
                receipt_handle=m["ReceiptHandle"],
                body=m["Body"],
                source_arn=queue_arn(url),
                receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
                sent_ms=int(m["Attributes"]["SentTimestamp"]),
            )
            for m in got
        ]
        failed: set[str] = set()

        def body(cn: _Container, invocation: Invocation) -> None:
            services = EmitterServices(
                delivery=cn.delivery,
                store=cn.store,
                delay_queue=cn.delay_queue,
                dead_letters=cn.dead_letters,
                rejects=cn.rejects,
                payloads=cn.payloads,
                stats=cn.stats,
                shaper=cn.shaper,
            )
            result = emit_batch(
                messages_from_event({"Records": records}),
                settings=self.settings,
                services=services,
                clock=cn.clock,
                sleep=self.world.sleep,
                deadline=self.world.deadline(invocation),
            )
            failed.update(result.failed)

        def done(ok: bool) -> None:
            self._emitters -= 1
            if ok and self._poller_may("emitter", "DeleteMessage", url):
                for m in got:
                    if m["MessageId"] in failed:
                        continue
                    self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    if self.world.chance(self.knobs.sqs_duplicate, "sqs-duplicate"):
                        # The delete did not reach every copy: it comes back.
                        self.sqs.send_message(
                            QueueUrl=url, MessageBody=m["Body"], DelaySeconds=DELAY_VISIBILITY_S
                        )
            self.world.at(self.world.now_ms, self._poll_delay_queue)

        self._invoke("emitter", body, done)
        self.world.at(self.world.now_ms, self._poll_delay_queue)

    # --- DynamoDB stream -> cleanup -------------------------------------------------------

    def _wake_stream(self, after_ms: int) -> None:
        """Look at the stream ``after_ms`` from now, unless a look or a batch is under way."""
        if self._stream_busy or self._stream_polling:
            return
        if self._stream_position >= len(self.ttl.stream):
            return
        self._stream_polling = True
        self.world.at(self.world.now_ms + after_ms, self.poll_stream)

    def poll_stream(self) -> None:
        """Invoke cleanup with the next batch from the event source's position."""
        self._stream_polling = False
        if self._stream_busy or self._stream_position >= len(self.ttl.stream):
            return
        start = self._stream_position
        batch = self.ttl.stream[start : start + self._stream_batch]
        self._stream_busy = True
        failed: list[int] = []

        def body(cn: _Container, invocation: Invocation) -> None:
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
            self._stream_busy = False
            if ok and not failed:
                self._stream_position = start + len(batch)
                self._stream_attempts = 0
                self._stream_batch = STREAM_BATCH
                self._wake_stream(0)
                return
            if ok:  # a partial batch response: the source resumes from the first failure
                self._stream_position = start + failed[0]
            else:  # the invocation failed: its batch is split for the retry
                self._stream_batch = max(1, len(batch) // 2)
            self._stream_attempts += 1
            if self._stream_attempts > STREAM_RETRIES:
                rest = self.ttl.stream[self._stream_position : start + len(batch)]
                self.cleanup_failures.extend(r.raw for r in rest)
                self.world.faults["stream-on-failure"] += len(rest)
                self._stream_position = start + len(batch)
                self._stream_attempts = 0
                self._stream_batch = STREAM_BATCH
            self._wake_stream(STREAM_RETRY_MS)

        self._invoke("cleanup", body, done)

    # --- what the checker reads -----------------------------------------------------------

    def queue_bodies(self, url: str) -> list[str]:
        """Bodies still in a queue (dead-letter and reject queues)."""
        return [m.body for m in self.sqs.messages(url)]

    def rejected_record(self, body: str) -> dict[str, Any] | None:
        """The original record a reject-queue body keeps (inline or in S3)."""
        d = json.loads(body)
        if d.get("record") is not None:
            return dict(d["record"])
        ref = d.get("record_ref")
        if not isinstance(ref, str) or not ref.startswith("s3://"):
            return None
        bucket, _, key = ref.removeprefix("s3://").partition("/")
        data = self.s3.objects(bucket).get(key)
        return None if data is None else dict(json.loads(data))

    def payload(self, key: str) -> bytes | None:
        """An offloaded value."""
        return self.s3.objects(self.settings.payload_bucket).get(key)


class _Notifying:
    """The SQS client as functions see it: tells the pipeline what was sent where, so the
    event source looks again when those messages become visible."""

    def __init__(self, inner: FakeSqs, on_send: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_send = on_send

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("send_message", "send_message_batch"):
            return attr

        def send(**kwargs: Any) -> Any:
            answer = attr(**kwargs)
            self._on_send(kwargs["QueueUrl"])
            return answer

        return send
