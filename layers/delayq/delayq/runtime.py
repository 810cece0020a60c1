"""Builds the clients and adapters a handler needs, once per container (cold start).

Handlers call these factories lazily, on the first invocation, so importing a handler never
creates a client; tests and the local runner configure the environment first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

import boto3
from botocore.config import Config

from delayq import constants as c
from delayq.cleanup import CleanupServices
from delayq.direct import DirectServices
from delayq.emitter import EmitterServices
from delayq.ingest import IngestServices
from delayq.kafka import KafkaDelivery, make_producer
from delayq.payloads import PayloadStore
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue, RejectQueue, SqsQueue, TickQueue
from delayq.settings import Settings
from delayq.shaping import Shaper, catch_up_lead_ms
from delayq.stats import DeliveryStats, FlushPolicy
from delayq.store import MessageStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "cleanup_services",
    "client",
    "client_config",
    "delay_queue",
    "emitter_services",
    "ingest_services",
    "kafka_delivery",
    "message_store",
    "payload_store",
    "pending_counts",
    "reject_queue",
    "sqs_queue",
    "tick_queue",
]


def client_config(settings: Settings) -> Config:
    """The one policy of every AWS client: a single attempt (botocore's retries off, so only
    the layer's deadline-bounded ``retry_call`` retries) with short connect and read timeouts
    from ``settings``, so no call outlasts the time the invocation counts on."""
    return Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=settings.aws_connect_timeout_seconds,
        read_timeout=settings.aws_read_timeout_seconds,
        max_pool_connections=32,
    )


@overload
def client(service: Literal["dynamodb"], settings: Settings) -> DynamoDBClient: ...
@overload
def client(service: Literal["s3"], settings: Settings) -> S3Client: ...
@overload
def client(service: Literal["secretsmanager"], settings: Settings) -> SecretsManagerClient: ...
@overload
def client(service: Literal["sqs"], settings: Settings) -> SQSClient: ...
def client(service: str, settings: Settings) -> Any:
    """A boto3 client; ``AWS_ENDPOINT_URL`` (moto, LocalStack) is honoured by boto3 itself.

    Typed per service (the ``mypy_boto3_*`` stubs, a development dependency only) for the
    services the layer uses; any other name is a type error."""
    return boto3.client(service, region_name=settings.region, config=client_config(settings))


def message_store(settings: Settings) -> MessageStore:
    """The DynamoDB adapter."""
    settings.require("table_name")
    return MessageStore(
        client("dynamodb", settings),
        settings.table_name,
        shards=settings.shards,
        ttl_grace_seconds=settings.ttl_grace_seconds,
        max_delay_seconds=settings.max_delay_seconds,
        index_all=bool(settings.id_index),
    )


def payload_store(settings: Settings) -> PayloadStore:
    """The S3 claim-check adapter."""
    settings.require("payload_bucket")
    return PayloadStore(client("s3", settings), settings.payload_bucket)


def sqs_queue(settings: Settings, url: str) -> SqsQueue:
    """One SQS queue adapter."""
    return SqsQueue(client("sqs", settings), url)


def delay_queue(settings: Settings, url: str | None = None) -> DelayQueue:
    """The delay queue adapter (or, given its URL, the same bundling onto its dead-letter
    queue)."""
    settings.require("delay_queue_url")
    by_priority = {}
    if url is None:
        by_priority = {
            priority: sqs_queue(settings, settings.delay_queue_url_of(priority))
            for priority in (c.PRIORITY_HIGH, c.PRIORITY_LOW)
            if settings.delay_queue_url_of(priority) != settings.delay_queue_url
        }
    return DelayQueue(
        sqs_queue(settings, url or settings.delay_queue_url),
        settings.emit_lead_ms,
        bundle_max_bytes=settings.bundle_max_bytes,
        bundle_max_messages=settings.bundle_max_messages,
        by_priority=by_priority,
    )


def reject_queue(settings: Settings, payloads: PayloadStore) -> RejectQueue:
    """The reject queue adapter."""
    settings.require("reject_queue_url")
    return RejectQueue(sqs_queue(settings, settings.reject_queue_url), payloads)


def tick_queue(settings: Settings) -> TickQueue:
    """The FIFO tick queue adapter."""
    settings.require("tick_queue_url")
    return TickQueue(client("sqs", settings), settings.tick_queue_url)


def ingest_services(settings: Settings) -> IngestServices:
    """Everything ingest writes to; a producer for the direct path when a target cluster and
    a direct window are configured."""
    payloads = payload_store(settings)
    direct = None
    if settings.kafka_bootstrap and settings.direct_window_ms:
        direct = DirectServices(
            delivery=kafka_delivery(settings),
            stats=DeliveryStats(policy=FlushPolicy(max_messages=settings.stats_flush_messages)),
        )
    store = message_store(settings)
    return IngestServices(
        store=store,
        delay_queue=delay_queue(settings),
        rejects=reject_queue(settings, payloads),
        payloads=payloads,
        direct=direct,
        shaper=Shaper(store, settings.limits) if settings.limits.any else None,
        pending=pending_counts(settings) if settings.pending_counts else None,
    )


def pending_counts(settings: Settings) -> PendingCounts:
    """The pending counts (``delayq pending`` reads them, ingest keeps them)."""
    settings.require("table_name")
    return PendingCounts(client("dynamodb", settings), settings.table_name)


def kafka_delivery(settings: Settings) -> KafkaDelivery:
    """A producer for the target cluster (SCRAM reads its secret, the producer connects)."""
    settings.require("kafka_bootstrap")
    secrets = client("secretsmanager", settings) if settings.kafka_secret_arn else None
    return KafkaDelivery(
        lambda on_error: make_producer(settings, secrets, on_error),
        settings.kafka_timeout_seconds,
    )


def cleanup_services(settings: Settings) -> CleanupServices:
    """What the TTL safety net uses (no reject queue: it has nothing to reject)."""
    return CleanupServices(store=message_store(settings), delay_queue=delay_queue(settings))


def emitter_services(settings: Settings) -> EmitterServices:
    """Everything the emitter uses, including the Kafka producer."""
    settings.require("kafka_bootstrap", "delay_dlq_url")
    payloads = payload_store(settings)
    store = message_store(settings)
    limited = settings.limits.any
    return EmitterServices(
        delivery=kafka_delivery(settings),
        store=store,
        delay_queue=delay_queue(settings),
        dead_letters=delay_queue(settings, settings.delay_dlq_url),
        rejects=reject_queue(settings, payloads),
        payloads=payloads,
        stats=DeliveryStats(policy=FlushPolicy(max_messages=settings.stats_flush_messages)),
        shaper=(
            Shaper(store, settings.limits, claim_lead_ms=catch_up_lead_ms(settings))
            if settings.strict_caps and limited
            else None
        ),
    )
