"""Kafka producer factory and a batch delivery that checks every delivery report.

Security modes: PLAINTEXT, SSL, SASL/SCRAM (credentials from Secrets Manager, never from an
environment variable) and MSK IAM (OAUTHBEARER tokens from aws-msk-iam-sasl-signer-python).
The producer is idempotent (``enable.idempotence``, ``acks=all``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from delayq.exceptions import ConfigurationError
from delayq.settings import Settings

TokenProvider = Callable[[str], tuple[str, int]]
NO_REPORT = "no delivery report before the flush timeout"


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


def scram_credentials(secrets_client: Any, secret_arn: str) -> Mapping[str, str]:
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


def make_producer(settings: Settings, secrets_client: Any = None) -> Any:
    """Build the producer for the configured mode (SCRAM reads its secret once, here)."""
    from confluent_kafka import Producer  # noqa: PLC0415 -- keeps the layer importable without it

    credentials = None
    if settings.kafka_security.startswith("SASL_SCRAM"):
        if secrets_client is None:
            raise ConfigurationError("SASL/SCRAM needs a Secrets Manager client")
        credentials = scram_credentials(secrets_client, settings.kafka_secret_arn)
    return Producer(producer_config(settings, credentials=credentials))


class KafkaDelivery:
    """Produce a batch, flush, and report each record's fate from its delivery report."""

    def __init__(self, producer: Any, timeout_seconds: float) -> None:
        self._producer = producer
        self._timeout = timeout_seconds

    def produce(self, record: OutRecord, on_result: Callable[[str | None], None]) -> None:
        """Queue one record; ``on_result`` gets None on success or an error text."""

        def report(err: Any, _msg: Any) -> None:
            on_result(None if err is None else str(err))

        while True:
            try:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=record.headers,
                    on_delivery=report,
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports, then try again.
                self._producer.poll(0.05)
            except Exception as e:  # noqa: BLE001 -- any produce() refusal fails this record only
                on_result(f"produce refused: {e}")
                return

    def flush(self) -> int:
        """Wait for outstanding delivery reports; returns how many are still pending."""
        deadline = time.monotonic() + self._timeout
        remaining = int(self._producer.flush(self._timeout))
        while remaining and time.monotonic() < deadline:
            remaining = int(self._producer.flush(max(0.0, deadline - time.monotonic())))
        return remaining

    def deliver(self, records: Sequence[OutRecord]) -> list[str | None]:
        """Produce all, flush, and return per record None (acknowledged) or the error."""
        results: list[str | None] = [NO_REPORT] * len(records)
        for index, record in enumerate(records):
            self.produce(record, partial(results.__setitem__, index))
        self.flush()
        return results
