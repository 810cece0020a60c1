"""Kafka producer factory and a batch delivery that checks every delivery report.

Security modes: PLAINTEXT, SSL, SASL/SCRAM (credentials from Secrets Manager, never from an
environment variable) and MSK IAM (OAUTHBEARER tokens from aws-msk-iam-sasl-signer-python).
The producer is idempotent (``enable.idempotence``, ``acks=all``); a fatal error (an
idempotent producer cannot recover from one) makes the next record build a new producer.

Every failed delivery is classified (:class:`Failure`): the target cluster could not be
reached (timeouts, no leader, brokers down: nothing is wrong with the message), or it
refused this record (too large, unknown topic, not authorised). The emitter retries the
first for as long as an outage may last and dead-letters the second after a few attempts.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from delayq import constants as c
from delayq.exceptions import ConfigurationError
from delayq.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_secretsmanager import SecretsManagerClient

__all__ = [
    "NO_REPORT",
    "ErrorCallback",
    "Failure",
    "KafkaDelivery",
    "OutRecord",
    "ProducerFactory",
    "TokenProvider",
    "Undelivered",
    "classify",
    "make_producer",
    "msk_iam_token",
    "producer_config",
    "scram_credentials",
]

TokenProvider = Callable[[str], tuple[str, int]]
ErrorCallback = Callable[[Any], None]
#: Builds a producer that reports client-level errors (fatal ones included) to the callback.
ProducerFactory = Callable[[ErrorCallback], Any]


class Failure(enum.StrEnum):
    """Why a record was not delivered (also the dead-letter reason)."""

    UNAVAILABLE = "target-unavailable"
    REFUSED = "target-refused"
    # Not Kafka's: the claim-check object of the record's value does not exist.
    PAYLOAD_MISSING = "payload-missing"
    # Not Kafka's: the target is up, but the tenant's release cap had no second with room
    # (``strict_caps``: its late messages wait for the seconds its on-time messages leave).
    CAP_FULL = "release-cap-full"


@dataclass(frozen=True)
class Undelivered:
    """A record's failed delivery: its class and the client's own words."""

    failure: Failure
    detail: str


NO_REPORT = Undelivered(Failure.UNAVAILABLE, "no delivery report before the flush timeout")

# librdkafka error names (KafkaError.name()) that say the cluster or the connection failed,
# not the record: retried without using up the message's attempts. Any error the client
# marks retriable, or fatal (the producer's own state), is counted here too.
_UNAVAILABLE = frozenset(
    {
        "_MSG_TIMED_OUT",
        "_TIMED_OUT",
        "_TIMED_OUT_QUEUE",
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_RESOLVE",
        "_DESTROY",
        "_PURGE_QUEUE",
        "_PURGE_INFLIGHT",
        "_FATAL",
        "_WAIT_COORD",
        "_NODE_UPDATE",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "BROKER_NOT_AVAILABLE",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "KAFKA_STORAGE_ERROR",
        "THROTTLING_QUOTA_EXCEEDED",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "UNKNOWN_PRODUCER_ID",
        "INVALID_PRODUCER_EPOCH",
    }
)


def classify(error: Any) -> Undelivered:
    """The class of a delivery error (a ``confluent_kafka.KafkaError``, or an exception
    ``produce()`` raised, which carries one as its first argument when it is Kafka's)."""
    kafka_error = error
    if isinstance(error, BaseException):
        kafka_error = error.args[0] if error.args else None
    name = _call(kafka_error, "name")
    transient = name in _UNAVAILABLE or _call(kafka_error, "retriable") is True
    if transient or _call(kafka_error, "fatal") is True:
        return Undelivered(Failure.UNAVAILABLE, str(error))
    return Undelivered(Failure.REFUSED, str(error))


def _call(obj: Any, method: str) -> Any:
    function = getattr(obj, method, None)
    return function() if callable(function) else None


@dataclass(frozen=True)
class OutRecord:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def msk_iam_token(region: str) -> tuple[str, int]:
    """An MSK IAM auth token and its expiry (epoch ms), signed with the function's role."""
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider  # noqa: PLC0415 -- only for MSK IAM

    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
    return str(token), int(expiry_ms)


def scram_credentials(secrets_client: SecretsManagerClient, secret_arn: str) -> Mapping[str, str]:
    """Read ``{"username", "password"}`` (two strings) from Secrets Manager."""
    response = secrets_client.get_secret_value(SecretId=secret_arn)
    problem = f"secret {secret_arn} must be JSON with 'username' and 'password' strings"
    try:
        secret = json.loads(response["SecretString"])  # a binary secret has no SecretString
        username, password = secret["username"], secret["password"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigurationError(problem) from e
    if not isinstance(username, str) or not isinstance(password, str):
        raise ConfigurationError(problem)
    return {"username": username, "password": password}


def producer_config(
    settings: Settings,
    *,
    credentials: Mapping[str, str] | None = None,
    token_provider: TokenProvider = msk_iam_token,
) -> dict[str, Any]:
    """The librdkafka configuration for the configured security mode."""
    if not settings.kafka_bootstrap:
        raise ConfigurationError("DELAYQ_KAFKA_BOOTSTRAP is not set")
    config: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "message.timeout.ms": int(settings.kafka_timeout_seconds * 1000),
        "client.id": "delayq-emitter",
        # librdkafka's default (1,000,000) is below the payloads ingest accepts: the limit
        # follows the largest payload plus the delivery headers and framing.
        "message.max.bytes": settings.kafka_max_message_bytes,
        # Bounds what the producer holds in memory (the emitter's memory budget).
        "queue.buffering.max.kbytes": c.EMIT_BUFFER_KBYTES,
    }
    mode = settings.kafka_security
    if mode == "PLAINTEXT":
        config["security.protocol"] = "PLAINTEXT"
        return config
    if settings.kafka_ca_location:
        config["ssl.ca.location"] = settings.kafka_ca_location
    if mode == "SSL":
        config["security.protocol"] = "SSL"
    elif mode == "MSK_IAM":
        region = settings.region

        def oauth_cb(_: Any) -> tuple[str, float]:
            token, expiry_ms = token_provider(region)
            return token, expiry_ms / 1000

        config.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "OAUTHBEARER",
                "oauth_cb": oauth_cb,
            }
        )
    else:
        if not credentials:
            raise ConfigurationError(f"{mode} needs credentials from Secrets Manager")
        config.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "SCRAM-SHA-512" if mode.endswith("512") else "SCRAM-SHA-256",
                "sasl.username": credentials["username"],
                "sasl.password": credentials["password"],
            }
        )
    return config


def make_producer(
    settings: Settings,
    secrets_client: SecretsManagerClient | None = None,
    error_cb: ErrorCallback | None = None,
) -> Any:
    """Build the producer for the configured mode (SCRAM reads its secret here);
    ``error_cb`` receives the client's own errors (a fatal one among them)."""
    from confluent_kafka import Producer  # noqa: PLC0415 -- keeps the layer importable without it

    credentials = None
    if settings.kafka_security.startswith("SASL_SCRAM"):
        if secrets_client is None:
            raise ConfigurationError("SASL/SCRAM needs a Secrets Manager client")
        credentials = scram_credentials(secrets_client, settings.kafka_secret_arn)
    config = producer_config(settings, credentials=credentials)
    if error_cb is not None:
        config["error_cb"] = error_cb
    return Producer(config)


class KafkaDelivery:
    """Produce records, flush, and report each record's fate from its delivery report.

    The producer is built by ``factory`` at once (a configuration error fails the cold
    start, not every delivery) and built again after a fatal error: an idempotent producer
    that hit one refuses every later record, so a cached producer would fail every batch of
    the container from then on.
    """

    def __init__(self, factory: ProducerFactory, timeout_seconds: float) -> None:
        self._factory = factory
        self._timeout = timeout_seconds
        self._fatal = False
        self.rebuilds = 0
        self._producer = factory(self._on_error)

    def _live(self) -> Any:
        if self._fatal:
            self.rebuilds += 1
            self._fatal = False
            self._producer = self._factory(self._on_error)
        return self._producer

    def _on_error(self, error: Any) -> None:
        if _call(error, "fatal") is True:
            self._fatal = True

    def produce(self, record: OutRecord, on_result: Callable[[Undelivered | None], None]) -> None:
        """Queue one record; ``on_result`` gets None on success or why it failed."""

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                self._on_error(err)
            on_result(None if err is None else classify(err))

        producer = self._live()
        while True:
            try:
                producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=record.headers,
                    on_delivery=report,
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports, then try again.
                producer.poll(0.05)
            except Exception as e:  # noqa: BLE001 -- any produce() refusal fails this record only
                refused = classify(e)
                self._on_error(e.args[0] if e.args else None)
                on_result(Undelivered(refused.failure, f"produce refused: {e}"))
                return

    def flush(self) -> int:
        """Wait for outstanding delivery reports; returns how many are still pending."""
        deadline = time.monotonic() + self._timeout
        remaining = int(self._producer.flush(self._timeout))
        while remaining and time.monotonic() < deadline:
            remaining = int(self._producer.flush(max(0.0, deadline - time.monotonic())))
        return remaining

    def deliver(self, records: Sequence[OutRecord]) -> list[Undelivered | None]:
        """Produce all, flush, and return per record None (acknowledged) or the failure."""
        results: list[Undelivered | None] = [NO_REPORT] * len(records)
        for index, record in enumerate(records):
            self.produce(record, partial(results.__setitem__, index))
        self.flush()
        return results
