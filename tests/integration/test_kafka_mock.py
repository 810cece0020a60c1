"""librdkafka's mock cluster, driven through ctypes, with real confluent-kafka clients."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from delayq.kafka import producer_config
from delayq.settings import Settings
from delayq_local import ApiKey, KafkaMockError, MockKafkaCluster
from delayq_local.faults import KafkaRequestErrors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                messages.append(message)
    finally:
        consumer.close()
    return messages


def whole_log(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every record's value in the topic, read from the beginning to each partition's end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}"})
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while sum(ends.values()) > len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
        assert len(values) == sum(ends.values()), "the log was not read to its end"
        return values
    finally:
        consumer.close()


def test_real_clients_produce_and_consume_through_the_mock(kafka: MockKafkaCluster) -> None:
    topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=3)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(30):
        producer.produce(topic, key=f"k{i}", value=f"v{i}".encode(), headers=[("h", b"\xff")])
    assert producer.flush(10) == 0

    messages = consume_all(kafka.bootstrap_servers, topic, 30, timeout=20)

    assert sorted(m.value() or b"" for m in messages) == sorted(f"v{i}".encode() for i in range(30))
    assert {m.partition() for m in messages} == {0, 1, 2}
    assert messages[0].headers() == [("h", b"\xff")]


def test_create_topic_sets_the_partition_count(kafka: MockKafkaCluster) -> None:
    topic = f"parts-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=5)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

    metadata = producer.list_topics(topic, timeout=10)

    assert len(metadata.topics[topic].partitions) == 5


def test_records_produced_while_the_broker_is_down_arrive_after_it_is_up() -> None:
    with MockKafkaCluster(brokers=1) as cluster:
        topic = "outage"
        cluster.create_topic(topic, partitions=1)
        producer = Producer(
            {"bootstrap.servers": cluster.bootstrap_servers, "message.timeout.ms": 30000}
        )
        producer.produce(topic, value=b"before")
        assert producer.flush(10) == 0
        delivered: list[bytes | None] = []

        cluster.broker_down(1)
        for i in range(5):
            producer.produce(
                topic,
                value=f"during-{i}".encode(),
                on_delivery=lambda err, msg: delivered.append(msg.value()) if err is None else None,
            )
        down_until = time.monotonic() + 3
        while time.monotonic() < down_until:
            producer.poll(0.2)
        assert delivered == []  # nothing can be acknowledged by a broker that is down
        cluster.broker_up(1)

        assert producer.flush(20) == 0
        assert len(delivered) == 5
        values = [m.value() for m in consume_all(cluster.bootstrap_servers, topic, 6, timeout=20)]
        assert values == [b"before", *(f"during-{i}".encode() for i in range(5))]


def test_pushed_request_errors_fail_the_next_requests_of_that_type(
    kafka: MockKafkaCluster,
) -> None:
    topic = f"errors-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "retries": 0})
    producer.list_topics(topic, timeout=10)
    reports: list[KafkaError | None] = []

    kafka.push_request_errors(ApiKey.PRODUCE, [KafkaError.MSG_SIZE_TOO_LARGE])
    producer.produce(topic, value=b"refused", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(10)
    producer.produce(topic, value=b"accepted", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(10)

    first, second = reports
    assert first is not None
    assert first.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert second is None


def test_dropped_produce_connections_lose_no_record_an_idempotent_producer_acknowledged(
    kafka: MockKafkaCluster,
) -> None:
    """What the fault scenarios push on Produce: the product's own producer configuration
    (idempotent, acks=all) gets a report for every record, and each one reported delivered is
    in the log once."""
    topic = f"drops-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=3)
    config = producer_config(Settings(kafka_bootstrap=kafka.bootstrap_servers))
    producer = Producer({**config, "log_level": 0})
    reports: dict[bytes, KafkaError | None] = {}

    def report(err: KafkaError | None, msg: Message) -> None:
        reports[msg.value() or b""] = err

    producer.produce(topic, value=b"warm", on_delivery=report)
    assert producer.flush(10) == 0  # the producer id is assigned before the errors
    assert reports.pop(b"warm") is None

    kafka.push_request_errors(ApiKey.PRODUCE, [KafkaError._TRANSPORT] * 6)
    for n in range(40):
        producer.produce(topic, value=f"m{n}".encode(), on_delivery=report)
        producer.poll(0)
        time.sleep(0.005)
    assert producer.flush(30) == 0

    delivered = sorted(value for value, err in reports.items() if err is None)
    in_log = whole_log(kafka.bootstrap_servers, topic, partitions=3)
    assert len(reports) == 40
    assert delivered
    assert [v for v in delivered if v not in in_log] == []
    # The mock appends a retried request again (it does not check sequence numbers): some
    # records may be there twice; none may be missing.
    assert b"warm" in in_log


@pytest.mark.parametrize(
    "code",
    [KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT],
)
def test_retriable_produce_errors_are_refused_as_the_mock_cannot_model_them(code: int) -> None:
    # The mock checks sequence numbers for transactional producers only: after a retriable
    # error it appends the next request in flight, and the idempotent producer then reports a
    # record delivered that is not in the log.
    with pytest.raises(ValueError, match="cannot model retriable Produce errors"):
        KafkaRequestErrors(ApiKey.PRODUCE, (KafkaError._TRANSPORT, code))


def test_dropped_connections_refusals_and_other_requests_errors_are_taken() -> None:
    KafkaRequestErrors(
        ApiKey.PRODUCE, (KafkaError._TRANSPORT, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    )
    KafkaRequestErrors(ApiKey.FETCH, (KafkaError.NOT_LEADER_FOR_PARTITION,))


def test_calls_on_a_stopped_cluster_raise() -> None:
    cluster = MockKafkaCluster()

    with pytest.raises(KafkaMockError):
        _ = cluster.bootstrap_servers
    with pytest.raises(KafkaMockError):
        cluster.create_topic("x")


def test_a_cluster_needs_a_broker() -> None:
    with pytest.raises(KafkaMockError):
        MockKafkaCluster(brokers=0)
