"""The Kafka event source: MSK-shaped batches, commits after success, redelivery on failure."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from delayq_local import EventFilter, LocalFunction, MockKafkaCluster
from delayq_local.doubles import RecordingHandler, wait_until
from delayq_local.kafka_mock import CONSUMER_TUNING
from delayq_local.sources import KafkaEventSource, java_bytes
from delayq_local.specs import KafkaEventSpec
from tests.integration.support import Runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def spec(topic: str, **changes: Any) -> KafkaEventSpec:
    values: dict[str, Any] = {
        "name": "DelayTopic",
        "kind": "SelfManagedKafka",
        "topics": (topic,),
        "starting_position": "TRIM_HORIZON",
        "batching_window_seconds": 0.2,
        "consumer_group_id": f"group-{topic}",
    }
    values.update(changes)
    return KafkaEventSpec(**values)


def kafka_source(kafka: MockKafkaCluster, event: KafkaEventSpec, handler: Any) -> KafkaEventSource:
    return KafkaEventSource(
        LocalFunction.of(handler, "ingest", timeout_seconds=10),
        event,
        kafka.bootstrap_servers,
        retry_backoff_seconds=0.2,
        consumer_config=CONSUMER_TUNING,
    )


def produce(kafka: MockKafkaCluster, topic: str, values: list[bytes], **kwargs: Any) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for value in values:
        producer.produce(topic, value=value, **kwargs)
    assert producer.flush(15) == 0


def records(handler: RecordingHandler) -> list[dict[str, Any]]:
    return [r for event in handler.events for batch in event["records"].values() for r in batch]


def values(handler: RecordingHandler) -> list[bytes]:
    return [base64.b64decode(r["value"]) for r in records(handler)]


def committed(kafka: MockKafkaCluster, group: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
        return [tp.offset for tp in offsets]
    finally:
        consumer.close()


def test_batches_have_the_lambda_kafka_event_shape(
    kafka: MockKafkaCluster, topic: str, running: Runner
) -> None:
    handler = RecordingHandler()
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(
        topic,
        key=b"k1",
        value=b"v1",
        partition=1,
        headers=[("delay-target", b"orders.eu"), ("raw", b"\x00\x7f\x80\xff")],
    )
    producer.produce(topic, value=b"no-key", partition=1)
    assert producer.flush(10) == 0

    running(kafka_source(kafka, spec(topic), handler))

    assert wait_until(lambda: len(records(handler)) == 2, 20)
    event = handler.events[0]
    assert event["eventSource"] == "SelfManagedKafka"
    assert event["bootstrapServers"] == kafka.bootstrap_servers
    assert list(event["records"]) == [f"{topic}-1"]
    first, second = event["records"][f"{topic}-1"]
    assert (first["topic"], first["partition"], first["offset"]) == (topic, 1, 0)
    assert first["key"] == base64.b64encode(b"k1").decode()
    assert first["value"] == base64.b64encode(b"v1").decode()
    assert first["timestampType"] == "CREATE_TIME"
    assert abs(first["timestamp"] - time.time() * 1000) < 60_000
    assert first["headers"] == [
        {"delay-target": list(b"orders.eu")},
        {"raw": [0, 127, -128, -1]},  # Java bytes are signed
    ]
    assert "key" not in second


def test_msk_events_carry_the_cluster_arn(
    kafka: MockKafkaCluster, topic: str, running: Runner
) -> None:
    handler = RecordingHandler()
    arn = "arn:aws:kafka:us-east-1:123456789012:cluster/demo/abc-1"
    produce(kafka, topic, [b"x"])

    running(kafka_source(kafka, spec(topic, kind="MSK", source_arn=arn), handler))

    assert wait_until(lambda: handler.calls == 1, 20)
    assert handler.events[0]["eventSource"] == "aws:kafka"
    assert handler.events[0]["eventSourceArn"] == arn


def test_offsets_are_committed_only_after_a_successful_invocation(
    kafka: MockKafkaCluster, topic: str, running: Runner
) -> None:
    outcomes = iter([False, False, True])

    def fail_twice(_event: Any, _context: Any) -> None:
        if not next(outcomes, True):
            raise RuntimeError("store unavailable")

    handler = RecordingHandler(fail_twice)
    produce(kafka, topic, [b"a", b"b", b"c"], partition=0)
    event = spec(topic)

    src = running(kafka_source(kafka, event, handler))

    assert wait_until(lambda: handler.calls >= 1, 20)
    assert committed(kafka, str(event.consumer_group_id), topic)[0] < 0  # nothing yet
    assert wait_until(lambda: src.stats["invocations"] == 3, 20)
    assert wait_until(lambda: committed(kafka, str(event.consumer_group_id), topic)[0] == 3, 10)
    batches = [
        [base64.b64decode(r["value"]) for r in e["records"][f"{topic}-0"]] for e in handler.events
    ]
    assert batches == [[b"a", b"b", b"c"]] * 3  # the same batch, redelivered
    assert src.stats["redelivered_batches"] == 2


def test_nothing_is_lost_when_the_broker_goes_down_mid_run() -> None:
    with MockKafkaCluster(brokers=1) as cluster:
        topic = "outage"
        cluster.create_topic(topic, partitions=2)
        handler = RecordingHandler()
        src = kafka_source(cluster, spec(topic), handler).start()
        try:
            producer = Producer(
                {"bootstrap.servers": cluster.bootstrap_servers, "message.timeout.ms": 60000}
            )
            for i in range(20):
                producer.produce(topic, value=f"before-{i}".encode())
            producer.flush(10)

            cluster.broker_down(1)
            for i in range(20):
                producer.produce(topic, value=f"during-{i}".encode())
            time.sleep(4)
            cluster.broker_up(1)
            assert producer.flush(30) == 0

            expected = {f"{p}-{i}".encode() for p in ("before", "during") for i in range(20)}
            assert wait_until(lambda: set(values(handler)) >= expected, 45)
        finally:
            src.stop()


def test_latest_skips_what_was_written_before_the_consumer_started(
    kafka: MockKafkaCluster, topic: str, running: Runner
) -> None:
    handler = RecordingHandler()
    produce(kafka, topic, [b"old"])

    src = running(kafka_source(kafka, spec(topic, starting_position="LATEST"), handler))
    assert src.wait_assigned(20)
    produce(kafka, topic, [b"new"])

    assert wait_until(lambda: handler.calls >= 1, 20)
    time.sleep(0.5)
    assert values(handler) == [b"new"]


def test_one_consumer_per_partition_each_with_its_own_environment(
    kafka: MockKafkaCluster, topic: str, running: Runner
) -> None:
    loaded: list[RecordingHandler] = []

    def load() -> RecordingHandler:
        loaded.append(RecordingHandler())
        return loaded[-1]

    src = running(
        KafkaEventSource(
            LocalFunction(name="ingest", loader=load, timeout_seconds=10),
            spec(topic, starting_position="LATEST"),
            kafka.bootstrap_servers,
            consumers=2,
            consumer_config=CONSUMER_TUNING,
        )
    )
    assert src.wait_assigned(20)
    produce(kafka, topic, [b"p0"], partition=0)
    produce(kafka, topic, [b"p1"], partition=1)

    assert wait_until(lambda: sum(h.calls for h in loaded) == 2, 20)
    assert [h.calls for h in loaded] == [1, 1]
    keys = {k for h in loaded for k in h.events[0]["records"]}
    assert keys == {f"{topic}-0", f"{topic}-1"}


def test_records_the_filter_drops_are_committed_without_an_invocation(
    kafka: MockKafkaCluster, topic: str, running: Runner
) -> None:
    handler = RecordingHandler()
    only_orders = EventFilter.from_criteria(
        {"Filters": [{"Pattern": json.dumps({"value": {"kind": ["order"]}})}]}
    )
    produce(kafka, topic, [b'{"kind": "order"}', b'{"kind": "other"}', b"\xff"], partition=0)
    event = spec(topic, filter=only_orders)

    src = running(kafka_source(kafka, event, handler))

    assert wait_until(lambda: committed(kafka, str(event.consumer_group_id), topic)[0] == 3, 20)
    assert values(handler) == [b'{"kind": "order"}']
    assert src.stats["filtered"] == 2


def test_java_bytes_are_signed() -> None:
    assert java_bytes(b"\x00\x7f\x80\xff") == [0, 127, -128, -1]
    assert java_bytes("é") == [-61, -87]
    assert java_bytes(None) is None
