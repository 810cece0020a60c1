"""A 1 MiB value through the whole pipeline on the embedded stack: Kafka (mock cluster) in,
the S3 claim-check, the delay queue, the producer, Kafka out, byte for byte."""

from __future__ import annotations

import hashlib
import time

import pytest
from confluent_kafka import Message

from delayq import constants as c
from delayq_local import EmbeddedStack, StackConfig
from delayq_local.producer import DelayProducer, Due
from tests.integration.support import consume, fast_stack, header_text

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TARGET = "big.values"
MIB = 1024 * 1024
# Records up to the payload limit plus the delivery headers: what a target topic's (and the
# delay topic's) max.message.bytes must allow, as the README says.
CLIENT_LIMIT = {"message.max.bytes": MIB + c.KAFKA_RECORD_OVERHEAD_BYTES}


def config(stack_name: str) -> StackConfig:
    return fast_stack(stack_name, "big.*", TARGET)


def received(bootstrap: str, timeout: float) -> list[Message]:
    return consume(
        bootstrap,
        TARGET,
        until=time.monotonic() + timeout,
        limit=2,
        config={"fetch.max.bytes": 8 * MIB, "max.partition.fetch.bytes": 8 * MIB},
    )


def test_a_1_mib_value_is_delivered_byte_identical_on_both_paths(stack_name: str) -> None:
    # Not compressible (zlib would hide a size problem) and different per message.
    values = {
        delay_id: hashlib.shake_256(delay_id.encode()).digest(MIB)
        for delay_id in ("big-queued", "big-stored")
    }
    with EmbeddedStack(config(stack_name)) as stack:
        producer = DelayProducer(stack.kafka_bootstrap, stack.delay_topic, CLIENT_LIMIT)
        now_ms = int(time.time() * 1000)
        # One due within the horizon (delay queue), one beyond it (store, then scheduler).
        producer.send(
            TARGET, Due(at_ms=now_ms + 3_000), value=values["big-queued"], delay_id="big-queued"
        )
        producer.send(
            TARGET, Due(at_ms=now_ms + 25_000), value=values["big-stored"], delay_id="big-stored"
        )
        producer.flush()
        producer.close()
        messages = received(stack.kafka_bootstrap, timeout=90)
        dead = stack.client("sqs").get_queue_attributes(
            QueueUrl=stack.resource("DelayDeadLetterQueue").ref,
            AttributeNames=["ApproximateNumberOfMessages"],
        )["Attributes"]["ApproximateNumberOfMessages"]
    by_id = {header_text(m, c.HEADER_ID): m for m in messages}
    assert sorted(by_id) == ["big-queued", "big-stored"]
    for delay_id, message in by_id.items():
        assert message.value() == values[delay_id], delay_id
        emitted_ms = int(header_text(message, c.HEADER_EMITTED_MS))
        assert emitted_ms >= int(header_text(message, c.HEADER_DUE_MS))
    assert dead == "0"
