"""Kafka: producer configuration per security mode, SCRAM secrets, batch delivery reports."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlparse

import boto3
import confluent_kafka
import pytest
from confluent_kafka import KafkaError
from moto import mock_aws

from delayq.exceptions import ConfigurationError
from delayq.kafka import (
    NO_REPORT,
    Failure,
    KafkaDelivery,
    OutRecord,
    ProducerFactory,
    Undelivered,
    classify,
    make_producer,
    msk_iam_token,
    producer_config,
    scram_credentials,
)
from delayq.records import DelayRequest, delivery_headers
from delayq.settings import Settings
from testkit.kafka import CapturedProducer, DeliveryCallback, FakeProducer
from tests.factories import REGION

SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:delayq-kafka"


def kafka_settings(security: str = "PLAINTEXT", **overrides: Any) -> Settings:
    if security.startswith("SASL_SCRAM"):
        overrides.setdefault("kafka_secret_arn", SECRET_ARN)
    return Settings(kafka_bootstrap="b-1:9096,b-2:9096", kafka_security=security, **overrides)


def fixed(producer: Any) -> ProducerFactory:
    """A factory that always hands out the same producer (it is never rebuilt)."""
    return lambda _on_error: producer


def record(topic: str = "orders.timeout", value: bytes | None = b"v") -> OutRecord:
    return OutRecord(topic, b"k", value, [("trace", b"t-1"), ("empty", None)])


@pytest.fixture
def secrets() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("secretsmanager", region_name=REGION)


# --- producer_config ---------------------------------------------------------------------------


def test_plaintext_config_is_idempotent_with_acks_all() -> None:
    assert producer_config(kafka_settings(kafka_timeout_seconds=2.5)) == {
        "bootstrap.servers": "b-1:9096,b-2:9096",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "message.timeout.ms": 2500,
        "client.id": "delayq-emitter",
        "message.max.bytes": 1024 * 1024 + 64 * 1024,
        "queue.buffering.max.kbytes": 32 * 1024,
        "security.protocol": "PLAINTEXT",
    }


def test_plaintext_config_ignores_a_ca_location() -> None:
    config = producer_config(kafka_settings(kafka_ca_location="/etc/ca.pem"))
    assert "ssl.ca.location" not in config


def test_ssl_config_uses_the_ca_location_when_given() -> None:
    config = producer_config(kafka_settings("SSL", kafka_ca_location="/etc/ca.pem"))
    assert (config["security.protocol"], config["ssl.ca.location"]) == ("SSL", "/etc/ca.pem")


def test_ssl_config_uses_the_system_store_by_default() -> None:
    config = producer_config(kafka_settings("SSL"))
    assert config["security.protocol"] == "SSL"
    assert "ssl.ca.location" not in config


@pytest.mark.parametrize(
    ("security", "mechanism"),
    [("SASL_SCRAM_SHA_512", "SCRAM-SHA-512"), ("SASL_SCRAM_SHA_256", "SCRAM-SHA-256")],
)
def test_scram_config_uses_the_mechanism_and_the_credentials(security: str, mechanism: str) -> None:
    config = producer_config(
        kafka_settings(security), credentials={"username": "alice", "password": "s3cret"}
    )
    assert {k: config[k] for k in config if k.startswith(("sasl.", "security."))} == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": mechanism,
        "sasl.username": "alice",
        "sasl.password": "s3cret",
    }


def test_scram_config_without_credentials_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="SASL_SCRAM_SHA_512 needs credentials"):
        producer_config(kafka_settings("SASL_SCRAM_SHA_512"))


def test_msk_iam_config_uses_oauthbearer_tokens_from_the_provider() -> None:
    asked: list[str] = []

    def provider(region: str) -> tuple[str, int]:
        asked.append(region)
        return "signed-token", 1_795_248_900_000

    config = producer_config(kafka_settings("MSK_IAM", region="eu-west-1"), token_provider=provider)
    assert (config["security.protocol"], config["sasl.mechanisms"]) == ("SASL_SSL", "OAUTHBEARER")
    assert asked == []
    assert config["oauth_cb"]("ignored-oauthbearer-config") == ("signed-token", 1_795_248_900.0)
    assert asked == ["eu-west-1"]


def test_msk_iam_config_keeps_a_ca_location() -> None:
    config = producer_config(
        kafka_settings("MSK_IAM", kafka_ca_location="/etc/ca.pem"),
        token_provider=lambda _: ("t", 0),
    )
    assert config["ssl.ca.location"] == "/etc/ca.pem"


def test_config_without_bootstrap_servers_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="DELAYQ_KAFKA_BOOTSTRAP"):
        producer_config(Settings())


def test_msk_iam_token_is_a_presigned_connect_url_for_the_region() -> None:
    token, expiry_ms = msk_iam_token("eu-west-1")
    url = urlparse(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    assert url.hostname == "kafka.eu-west-1.amazonaws.com"
    assert parse_qs(url.query)["Action"] == ["kafka-cluster:Connect"]
    assert expiry_ms > 1_700_000_000_000


# --- SCRAM credentials -------------------------------------------------------------------------


def test_scram_credentials_are_read_from_secrets_manager(secrets: Any) -> None:
    arn = secrets.create_secret(
        Name="delayq-kafka",
        SecretString=json.dumps({"username": "alice", "password": "s3cret", "note": "x"}),
    )["ARN"]
    assert scram_credentials(secrets, arn) == {"username": "alice", "password": "s3cret"}


@pytest.mark.parametrize(
    "secret_string",
    [
        "alice:s3cret",
        json.dumps({"username": "alice"}),
        json.dumps(["alice", "s3cret"]),
        json.dumps("alice"),
        json.dumps({"username": None, "password": "s3cret"}),
        json.dumps({"username": "alice", "password": 1234}),
    ],
)
def test_a_secret_of_the_wrong_shape_is_a_configuration_error(
    secrets: Any, secret_string: str
) -> None:
    arn = secrets.create_secret(Name="delayq-kafka", SecretString=secret_string)["ARN"]
    with pytest.raises(ConfigurationError, match="'username' and 'password'"):
        scram_credentials(secrets, arn)


def test_a_binary_secret_is_a_configuration_error(secrets: Any) -> None:
    arn = secrets.create_secret(Name="delayq-kafka", SecretBinary=b"\x00\x01")["ARN"]
    with pytest.raises(ConfigurationError, match="'username' and 'password'"):
        scram_credentials(secrets, arn)


# --- make_producer -----------------------------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confluent_kafka, "Producer", CapturedProducer)
    monkeypatch.setattr(CapturedProducer, "configs", [])


@pytest.mark.usefixtures("captured")
def test_make_producer_builds_a_producer_with_the_mode_config() -> None:
    producer = make_producer(kafka_settings())
    assert producer.config == producer_config(kafka_settings())


@pytest.mark.usefixtures("captured")
def test_make_producer_reads_the_scram_secret_once(secrets: Any) -> None:
    arn = secrets.create_secret(
        Name="delayq-kafka", SecretString=json.dumps({"username": "bob", "password": "pw"})
    )["ARN"]
    producer = make_producer(kafka_settings("SASL_SCRAM_SHA_256", kafka_secret_arn=arn), secrets)
    assert (producer.config["sasl.username"], producer.config["sasl.password"]) == ("bob", "pw")


@pytest.mark.usefixtures("captured")
def test_make_producer_for_scram_needs_a_secrets_client() -> None:
    with pytest.raises(ConfigurationError, match="Secrets Manager client"):
        make_producer(kafka_settings("SASL_SCRAM_SHA_512"))


# --- KafkaDelivery -----------------------------------------------------------------------------


class FullOnce(FakeProducer):
    """Its local queue is full for the first produce() call (BufferError), then has room."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True
        self.polls: list[float] = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        on_delivery: DeliveryCallback | None = None,
        **kwargs: Any,
    ) -> None:
        if self.full:
            self.full = False
            raise BufferError("Local: Queue full")
        super().produce(topic, value, key, headers, on_delivery, **kwargs)

    def poll(self, timeout: float = 0) -> int:
        self.polls.append(timeout)
        return super().poll(timeout)


class SlowReports(FakeProducer):
    """Reports arrive only on the second flush() call."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes: list[float] = []

    def flush(self, timeout: float = 0) -> int:
        self.flushes.append(timeout)
        if len(self.flushes) == 1:
            return len(self._pending)
        return super().flush(timeout)


def test_deliver_returns_none_for_every_acknowledged_record() -> None:
    producer = FakeProducer()
    results = KafkaDelivery(fixed(producer), 1.0).deliver([record("orders.a"), record("reminders")])
    assert results == [None, None]
    assert [(p.topic, p.key, p.value, list(p.headers)) for p in producer.produced] == [
        ("orders.a", b"k", b"v", [("trace", b"t-1"), ("empty", None)]),
        ("reminders", b"k", b"v", [("trace", b"t-1"), ("empty", None)]),
    ]


def test_deliver_reports_each_failed_record_with_its_error() -> None:
    producer = FakeProducer(fail_topics={"orders.gone"})
    results = KafkaDelivery(fixed(producer), 1.0).deliver(
        [record("orders.a"), record("orders.gone"), record("reminders")]
    )
    assert [r and r.failure for r in results] == [None, Failure.REFUSED, None]
    assert results[1] is not None
    assert "UNKNOWN_TOPIC_OR_PART" in results[1].detail


def test_a_full_local_queue_is_served_and_the_record_produced_again() -> None:
    producer = FullOnce()
    results = KafkaDelivery(fixed(producer), 1.0).deliver([record()])
    assert results == [None]
    assert producer.polls == [0.05]
    assert len(producer.produced) == 1


def test_a_refused_produce_fails_that_record_only() -> None:
    results: list[Undelivered | None] = []
    KafkaDelivery(fixed(FakeProducer(refuse=True)), 1.0).produce(record(), results.append)
    assert results == [Undelivered(Failure.REFUSED, "produce refused: refused by the test")]


def test_records_without_a_delivery_report_stay_failed() -> None:
    producer = FakeProducer(silent=True)
    delivery = KafkaDelivery(fixed(producer), 0.0)
    assert delivery.deliver([record(), record()]) == [NO_REPORT, NO_REPORT]
    assert producer.produced == []


def test_flush_returns_how_many_reports_are_still_missing() -> None:
    producer = FakeProducer(silent=True)
    delivery = KafkaDelivery(fixed(producer), 0.0)
    delivery.produce(record(), lambda _: None)
    assert delivery.flush() == 1


def test_flush_keeps_waiting_for_late_reports_within_the_timeout() -> None:
    producer = SlowReports()
    delivery = KafkaDelivery(fixed(producer), 30.0)
    assert delivery.deliver([record()]) == [None]
    assert len(producer.flushes) == 2
    assert producer.flushes[0] == 30.0
    assert 0 < producer.flushes[1] <= 30.0


def test_deliver_of_no_records_produces_nothing() -> None:
    producer = FakeProducer()
    assert KafkaDelivery(fixed(producer), 1.0).deliver([]) == []
    assert producer.produced == []


# --- failure classes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    ],
)
def test_a_cluster_that_cannot_be_reached_is_unavailable(code: int) -> None:
    assert classify(KafkaError(code)).failure is Failure.UNAVAILABLE


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.INVALID_RECORD,
    ],
)
def test_a_record_the_cluster_refuses_is_refused(code: int) -> None:
    assert classify(KafkaError(code)).failure is Failure.REFUSED


def test_an_error_kafka_marks_retriable_or_fatal_is_unavailable() -> None:
    assert classify(KafkaError(KafkaError.UNKNOWN, retriable=True)).failure is Failure.UNAVAILABLE
    assert classify(KafkaError(KafkaError.UNKNOWN, fatal=True)).failure is Failure.UNAVAILABLE


def test_an_exception_from_produce_is_classified_by_the_kafka_error_it_carries() -> None:
    too_large = confluent_kafka.KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert classify(too_large).failure is Failure.REFUSED
    assert classify(ValueError("not kafka's")).failure is Failure.REFUSED


def test_no_delivery_report_counts_as_unavailable() -> None:
    assert NO_REPORT.failure is Failure.UNAVAILABLE


# --- fatal errors: the producer is built again -------------------------------------------------


class FatalOnce(FakeProducer):
    """Its first record gets a fatal error (an idempotent producer's sequence broke)."""

    def flush(self, timeout: float = 0) -> int:
        pending, self._pending = self._pending, []
        for callback, _ in pending:
            if callback:
                callback(KafkaError(KafkaError._FATAL, fatal=True), None)
        return 0


def test_a_fatal_error_makes_the_next_record_use_a_new_producer() -> None:
    built: list[FakeProducer] = []

    def factory(on_error: Any) -> FakeProducer:
        producer: FakeProducer = FatalOnce() if not built else FakeProducer()
        built.append(producer)
        return producer

    delivery = KafkaDelivery(factory, 1.0)
    first = delivery.deliver([record()])
    second = delivery.deliver([record()])
    assert [r and r.failure for r in first] == [Failure.UNAVAILABLE]
    assert second == [None]
    assert (len(built), delivery.rebuilds) == (2, 1)
    assert len(built[1].produced) == 1


def test_a_fatal_error_reported_to_the_error_callback_also_rebuilds() -> None:
    callbacks: list[Any] = []

    def factory(on_error: Any) -> FakeProducer:
        callbacks.append(on_error)
        return FakeProducer()

    delivery = KafkaDelivery(factory, 1.0)
    assert delivery.deliver([record()]) == [None]
    callbacks[0](KafkaError(KafkaError._FATAL, fatal=True))
    callbacks[0](KafkaError(KafkaError._TRANSPORT))  # not fatal: nothing to rebuild for
    assert delivery.deliver([record()]) == [None]
    assert (len(callbacks), delivery.rebuilds) == (2, 1)


def test_the_producer_is_built_at_once_and_only_once_while_healthy() -> None:
    # At once: a configuration error fails the cold start, not every delivery.
    built: list[int] = []

    def factory(on_error: Any) -> FakeProducer:
        built.append(1)
        return FakeProducer()

    delivery = KafkaDelivery(factory, 1.0)
    assert built == [1]
    delivery.deliver([record(), record()])
    delivery.deliver([record()])
    assert built == [1]


def test_a_producer_that_cannot_be_configured_fails_construction() -> None:
    def factory(on_error: Any) -> FakeProducer:
        raise ConfigurationError("SASL/SCRAM needs credentials from Secrets Manager")

    with pytest.raises(ConfigurationError):
        KafkaDelivery(factory, 1.0)


@pytest.mark.usefixtures("captured")
def test_make_producer_hands_the_error_callback_to_librdkafka() -> None:
    def on_error(_: Any) -> None:
        return None

    assert make_producer(kafka_settings(), error_cb=on_error).config["error_cb"] is on_error


@pytest.mark.parametrize(
    ("max_payload", "expected"),
    [
        (1024, 1_000_000),
        (1024 * 1024, 1024 * 1024 + 64 * 1024),
        (5 * 1024 * 1024, 5 * 1024 * 1024 + 64 * 1024),
    ],
)
def test_message_max_bytes_follows_the_payload_limit(max_payload: int, expected: int) -> None:
    # librdkafka's default (1,000,000) would refuse a 1 MiB value that ingest accepts.
    config = producer_config(kafka_settings(max_payload_bytes=max_payload))
    assert config["message.max.bytes"] == expected


# --- the largest record ingest accepts fits the producer ----------------------------------------


def largest_accepted_record(settings: Settings) -> OutRecord:
    """Key + value + user headers at the payload limit, the longest id, the delivery headers."""
    request = DelayRequest(
        "\U0001f600" * 256,  # 1,024 bytes of UTF-8: the longest id
        "orders.timeout",
        2**53,
        b"k" * 1000,
        b"",
        (("trace", b"t" * 1000),),
        "delay-requests-11-123456789",
    )
    value = b"v" * (settings.max_payload_bytes - request.size)
    request = replace(request, value=value)
    assert request.size == settings.max_payload_bytes
    return OutRecord(
        request.target,
        request.key,
        request.value,
        delivery_headers(request, 2**53, 2**31),
    )


@pytest.mark.parametrize("max_payload", [1024 * 1024, 5 * 1024 * 1024])
def test_librdkafka_takes_the_largest_record_ingest_accepts(max_payload: int) -> None:
    settings = kafka_settings(max_payload_bytes=max_payload)
    # No broker is needed: librdkafka checks a record's size when it is produced.
    config = {**producer_config(settings), "bootstrap.servers": "127.0.0.1:1"}
    producer = confluent_kafka.Producer(config)
    record = largest_accepted_record(settings)
    producer.produce(record.topic, value=record.value, key=record.key, headers=list(record.headers))
    producer.purge()


def test_librdkafkas_default_limit_would_refuse_a_1_mib_value() -> None:
    # Why the limit is a setting: with the client's default, every 1 MiB message would fail.
    settings = kafka_settings(max_payload_bytes=1024 * 1024)
    config = {**producer_config(settings), "bootstrap.servers": "127.0.0.1:1"}
    del config["message.max.bytes"]
    producer = confluent_kafka.Producer(config)
    record = largest_accepted_record(settings)
    with pytest.raises(confluent_kafka.KafkaException) as caught:
        producer.produce(
            record.topic, value=record.value, key=record.key, headers=list(record.headers)
        )
    assert caught.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
