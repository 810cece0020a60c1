"""Helpers shared by the local-stack tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from delayq_local.sources import EventSource
from delayq_local.stack import StackConfig, TimeCompression

FIXTURES = Path(__file__).parent / "fixtures"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
S = TypeVar("S", bound=EventSource)


# Periods short enough that the stored path, the scheduler and TTL clean-up run within a test.
FAST = TimeCompression(
    horizon_seconds=15, lookahead_seconds=10, tick_seconds=2, ttl_grace_seconds=10
)


def fast_stack(stack_name: str, allowed: str, topic: str) -> StackConfig:
    """The project's template on the embedded stack, periods compressed, one target topic."""
    return StackConfig(
        project_root=PROJECT_ROOT,
        stack_name=stack_name,
        parameters={"AllowedTargets": allowed},
        topics=(topic,),
        environment={"LOG_LEVEL": "ERROR"},
        time=FAST,
    )


class Runner:
    """Starts sources for a test; the `running` fixture stops them all afterwards."""

    def __init__(self) -> None:
        self.started: list[EventSource] = []

    def __call__(self, source: S) -> S:
        self.started.append(source)
        return source.start()


def consume(
    bootstrap: str,
    topic: str,
    *,
    until: float,
    limit: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[Message]:
    """Every record of ``topic`` from the beginning, until ``until`` (monotonic seconds) or
    ``limit`` records."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            **(config or {}),
        }
    )
    metadata = consumer.list_topics(topic, timeout=10)
    consumer.assign(
        [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.topics[topic].partitions]
    )
    out: list[Message] = []
    try:
        while time.monotonic() < until and (limit is None or len(out) < limit):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                out.append(message)
    finally:
        consumer.close()
    return out


def header_text(message: Message, name: str) -> str:
    """One header of a consumed record, as text."""
    value = dict(message.headers() or [])[name]
    assert isinstance(value, bytes)
    return value.decode()
