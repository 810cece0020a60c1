"""Watching the outputs: deliveries on the target topics, rejections on the reject queue."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from delayq import constants as c

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """One record seen on a target topic, with the emitter's delivery headers."""

    delay_id: str
    topic: str
    due_ms: int
    emitted_ms: int
    received_ms: int
    attempt: int
    # When a release-rate cap let it go (delay-release-ms; 0: at its due time).
    release_ms: int = 0

    @property
    def free_ms(self) -> int:
        """When it was free to go: its due time, or the later slot a release cap gave it."""
        return max(self.due_ms, self.release_ms)


@dataclass(frozen=True)
class Rejection:
    """One reject-queue message: the reason, and the rejected record's value."""

    reason: str
    detail: str
    value: bytes | None


class DeliveryObserver:
    """A consumer of every partition of the target topics, from the beginning, in a thread.

    Partitions are assigned, not subscribed: a group member whose session times out (a broker
    outage longer than the session) is revoked and reads its partitions again, which would
    count as duplicates the product never wrote. A record seen twice at the same offset
    (`rereads`) is counted once.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Sequence[str],
        consumer_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"delayq-observer-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **(consumer_config or {}),
            }
        )
        self._topics = list(topics)
        self._deliveries: list[Delivery] = []
        self._offsets: set[tuple[str, int, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="observer", daemon=True)
        self.unreadable = 0
        self.rereads = 0

    def start(self, timeout: float = 30.0) -> DeliveryObserver:
        """Assign every partition of the topics (from the beginning) and start consuming."""
        metadata = self._consumer.list_topics(timeout=timeout)
        partitions = [
            TopicPartition(topic, partition, OFFSET_BEGINNING)
            for topic in self._topics
            if topic in metadata.topics
            for partition in metadata.topics[topic].partitions
        ]
        if not partitions:
            raise TimeoutError(f"no partitions found for {self._topics}")
        self._consumer.assign(partitions)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop consuming and close the consumer."""
        self._stop.set()
        self._thread.join(30)

    def deliveries(self) -> list[Delivery]:
        """Everything seen so far, in arrival order."""
        with self._lock:
            return list(self._deliveries)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # poll() returns as soon as a record is there; consume() would wait to fill a batch.
                message = self._consumer.poll(0.2)
                if message is not None:
                    self._accept(message)
        finally:
            self._consumer.close()

    def _accept(self, message: Message) -> None:
        if message.error() is not None:
            return
        try:
            delivery = delivery_of(message, int(time.time() * 1000))
        except (KeyError, ValueError) as e:
            self.unreadable += 1
            log.warning("a record without readable delivery headers: %r", e)
            return
        position = (delivery.topic, message.partition() or 0, message.offset() or 0)
        with self._lock:
            if position in self._offsets:
                self.rereads += 1
                return
            self._offsets.add(position)
            self._deliveries.append(delivery)


def delivery_of(message: Message, received_ms: int) -> Delivery:
    """A target-topic record's delivery headers (KeyError or ValueError when it has none)."""
    headers = message.headers() or []
    pairs = headers.items() if isinstance(headers, dict) else headers
    fields = dict(pairs)
    return Delivery(
        delay_id=_text(fields[c.HEADER_ID]),
        topic=str(message.topic()),
        due_ms=int(_text(fields[c.HEADER_DUE_MS])),
        emitted_ms=int(_text(fields[c.HEADER_EMITTED_MS])),
        received_ms=received_ms,
        attempt=int(_text(fields.get(c.HEADER_ATTEMPT) or b"1")),
        release_ms=int(_text(fields.get(c.HEADER_RELEASE_MS) or b"0")),
    )


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return value or ""


def drain_rejections(sqs: Any, queue_url: str) -> list[Rejection]:
    """Read (and delete) what the reject queue holds now."""
    found: list[Rejection] = []
    while True:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get(
            "Messages", []
        )
        if not messages:
            return found
        for message in messages:
            body = json.loads(message["Body"])
            record = body.get("record") or {}
            raw = record.get("value") if isinstance(record, dict) else None
            found.append(
                Rejection(
                    reason=str(body.get("reason")),
                    detail=str(body.get("detail")),
                    value=base64.b64decode(raw) if isinstance(raw, str) else None,
                )
            )
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
