"""The whole pipeline on the simulated world: the AWS resources, the real layer services
(ingest, timer, scheduler, emitter, cleanup) in Lambda's execution environments
(:mod:`sim.functions`), and the event sources that invoke them (:mod:`sim.sources`): Kafka
(ingest), EventBridge and the tick queue (timer, scheduler), the delay queue (emitter), the
table's stream (cleanup).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from delayq import constants as c
from delayq import control_clock
from delayq.envelope import decode_body
from delayq.exceptions import EnvelopeError
from delayq.kafka import KafkaDelivery
from delayq.payloads import PayloadStore
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue, RejectQueue, SqsQueue, TickQueue
from delayq.retry import Backoff
from delayq.settings import Settings
from delayq.shaping import Shaper, catch_up_lead_ms
from delayq.stats import DeliveryStats
from delayq.store import MessageStore
from sim.aws import ExpiryRule, LifecycleS3, ReplicatedDynamoDB, SimProducer, TargetCluster, Ttl
from sim.faults import DriftingClock, Faulty, Knobs, RetryLedger
from sim.functions import Container, Functions
from sim.iam import Roles, parameter, resolved_property, roles
from sim.sources.delay_queue import DelayQueueSource
from sim.sources.kafka import KafkaSource
from sim.sources.operator import Operator
from sim.sources.sqs import QueuePoller
from sim.sources.stream import StreamSource
from sim.sources.ticks import Ticks
from sim.world import World
from testkit.aws import (
    FakeSqs,
    RequestCounter,
    as_dynamodb_client,
    as_s3_client,
    as_sqs_client,
)
from testkit.clock import SerialExecutor
from testkit.services import message_store

DELAY_TOPIC: Final = "delay-requests"
ALLOWED: Final = ("orders.*", "reminders")


def sim_settings(roles: Roles, **overrides: Any) -> Settings:
    """AWS's periods (15-minute horizon, 1-minute tick), the TTL grace the template deploys
    (``TtlGraceSeconds``; the scheduler outage knob is longer); the resources the template
    names."""
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
        "ttl_grace_seconds": int(parameter("TtlGraceSeconds")),
        "ttl_clock_margin_seconds": 60,
        "stats_flush_messages": 1000,
    }
    values.update(overrides)
    return Settings(**values)


def limited_settings(roles: Roles, tenant_limits: str) -> Settings:
    """:func:`sim_settings` with tenant limits (``DELAYQ_TENANT_LIMITS``) and the template's
    delay queues of high and low priority, each with its own event source."""
    names = roles.names
    return sim_settings(
        roles,
        tenant_limits=tenant_limits,
        delay_queue_high_url=names["DelayHighQueue"],
        delay_queue_low_url=names["DelayLowQueue"],
    )


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
        for url in (*self.delay_queue_urls, s.delay_dlq_url, s.reject_queue_url, s.tick_queue_url):
            created = self.sqs.create_queue(QueueName=url.rsplit("/", 1)[-1])["QueueUrl"]
            if created != url:
                raise ValueError(f"queue {url} would be created as {created}")
        self.s3 = LifecycleS3(world, knobs, self.counter)
        self.s3.create_bucket(Bucket=s.payload_bucket)
        # The payload bucket's lifecycle rules, as the template deploys them.
        self.s3.rules[s.payload_bucket] = ExpiryRule.of(
            resolved_property("PayloadBucket", "LifecycleConfiguration")
        )
        if world.rng.random() >= knobs.fresh_stack:
            self._running_for_a_day()
        self.ttl = Ttl(world, knobs, self.dynamodb, s.table_name)
        self.cluster = TargetCluster()
        self.retries = RetryLedger()  # transient errors the invocations have not retried yet
        self.ingest_behind_ms = 0
        self.functions = Functions(world, knobs, self.retries, self._container)
        self.kafka = KafkaSource(world, knobs, s, self.functions)
        self.operator = Operator(
            world,
            knobs=knobs,
            settings=s,
            functions=self.functions,
            bodies=self.queue_bodies,
            clients=self._operator_clients,
        )
        self.ticks = Ticks(
            world, knobs, s, self.functions, sqs=self.sqs, roles=self.roles, url=s.tick_queue_url
        )
        self.delay_queues = [
            DelayQueueSource(
                world, knobs, s, self.functions, sqs=self.sqs, roles=self.roles, url=url
            )
            for url in self.delay_queue_urls
        ]
        self.stream = StreamSource(world, self.ttl, self.functions)
        self._pollers: dict[str, QueuePoller] = {
            poller.url: poller for poller in (*self.delay_queues, self.ticks)
        }
        # The release slots the emitters gave late capped messages, by (id, due): the
        # envelopes they put back on the delay queues carry them (``pc``).
        self.paced: dict[tuple[str, int], int] = {}
        # With a delay queue per priority: every envelope sent to one, as (queue URL, id,
        # due, the priority it carries), for the checker's routing rule.
        self.delay_sends: list[tuple[str, str, int, str]] = []

    def _running_for_a_day(self) -> None:
        """The control clocks of a stack deployed a day ago (``delayq.control_clock``)."""
        floor = control_clock.floor_for(self.world.now_ms - 86_400_000)
        for shard in range(self.settings.shards):
            item = {
                **control_clock.clock_key(shard),
                "kind": {"S": control_clock.KIND_CLOCK},
                control_clock.ATTR_FLOOR: {"N": str(floor)},
            }
            for table in (self.dynamodb.primary, *self.dynamodb.followers):
                table.put_item(TableName=self.settings.table_name, Item=dict(item))

    @property
    def delay_queue_urls(self) -> tuple[str, ...]:
        """The delay queues: the normal one, and those of other priorities the settings name."""
        s = self.settings
        return (
            s.delay_queue_url,
            *(u for u in (s.delay_queue_high_url, s.delay_queue_low_url) if u),
        )

    def _container(self, function: str) -> Container:
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

        by_priority = {
            priority: queue(url)
            for priority, url in (
                (c.PRIORITY_HIGH, s.delay_queue_high_url),
                (c.PRIORITY_LOW, s.delay_queue_low_url),
            )
            if url
        }
        return Container(
            clock=clock,
            store=store,
            payloads=payloads,
            delay_queue=DelayQueue(
                queue(s.delay_queue_url), s.emit_lead_ms, by_priority=by_priority
            ),
            dead_letters=DelayQueue(queue(s.delay_dlq_url), s.emit_lead_ms),
            rejects=RejectQueue(queue(s.reject_queue_url), payloads),
            tick_queue=TickQueue(as_sqs_client(sqs), s.tick_queue_url),
            delivery=KafkaDelivery(lambda _on_error: producer, s.kafka_timeout_seconds),
            stats=DeliveryStats(instance_id=f"sim-{function}"),
            pending=PendingCounts(as_dynamodb_client(dynamodb), s.table_name, backoff=backoff),
            shaper=self._shaper(function, store),
        )

    def _operator_clients(self, _container: Container) -> tuple[Any, Any]:
        """An operator's SQS and S3 clients (``delayq redrive``): AWS's faults, no role."""
        world, knobs, guard, ledger = self.world, self.knobs, self.roles.guard, self.retries
        sqs = Faulty(_Notifying(self.sqs, self._sent), world, knobs, "sqs", guard, ledger=ledger)
        s3 = Faulty(self.s3, world, knobs, "s3", guard, ledger=ledger)
        return as_sqs_client(sqs), as_s3_client(s3)

    def _shaper(self, function: str, store: MessageStore) -> Shaper | None:
        limits = self.settings.limits
        if not limits.any or (function == "emitter" and not self.settings.strict_caps):
            return None
        return Shaper(store, limits, claim_lead_ms=catch_up_lead_ms(self.settings))

    def start(self, until_ms: int) -> None:
        """Start the periodic sources: EventBridge's ticks until ``until_ms``, TTL sweeps."""
        self.stream.start()
        self.ttl.start()
        self.ticks.start(until_ms)

    @property
    def clock_offset_ms(self) -> int:
        """How far apart two functions' clocks may be in this run, beyond the normal skew."""
        return self.ingest_behind_ms

    def _sent(self, url: str, sent: dict[str, Any]) -> None:
        """``sent`` (a send's parameters) went to ``url``: its event source looks again when it
        is visible. A body put on a delay queue may carry the new slot a late capped message
        took (``pc``): kept in ``paced``."""
        poller = self._pollers.get(url)
        if poller is None:
            return
        poller.wake()
        if url in self.delay_queue_urls and self.settings.limits.any:
            every = len(self.delay_queue_urls) > 1
            for e in sent.get("Entries") or [sent]:
                if every or '"pc"' in e["MessageBody"]:
                    self._decoded(url, e["MessageBody"])

    def _decoded(self, url: str, body: str) -> None:
        """Keep what the checker needs of a body sent to a delay queue: the slots of late
        capped messages and, with a queue per priority, where each envelope went."""
        try:
            entries = decode_body(body)
        except EnvelopeError:
            return
        several = len(self.delay_queue_urls) > 1
        for entry in entries:
            r = entry.request
            if r is None:
                continue
            if several:
                self.delay_sends.append((url, r.delay_id, r.due_ms, r.priority))
            if r.paced_ms:
                key = (r.delay_id, r.due_ms)
                self.paced[key] = max(self.paced.get(key, 0), r.paced_ms)

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
    event source looks again when those messages become visible (and the checker sees the
    slots the emitters gave late capped messages)."""

    def __init__(self, inner: FakeSqs, on_send: Callable[[str, dict[str, Any]], None]) -> None:
        self._inner = inner
        self._on_send = on_send

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("send_message", "send_message_batch"):
            return attr

        def send(**kwargs: Any) -> Any:
            answer = attr(**kwargs)
            self._on_send(kwargs["QueueUrl"], kwargs)
            return answer

        return send
