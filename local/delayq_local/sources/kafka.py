"""The Kafka event source (MSK or self-managed): Lambda's consumer-group pollers.

`consumers` consumers share the group (Lambda runs up to one concurrent invocation per
partition), each with its own execution environment. A batch is what one `consume()` returns
within the batching window, up to `BatchSize` records,
shaped like Lambda's event: records grouped under `"<topic>-<partition>"`, key and value base64,
header values as arrays of Java (signed) bytes. Offsets are committed only after the function
succeeds; on failure the consumer seeks back to the batch's first offset of each partition, and
the same records come again (Lambda retries a failing Kafka batch until it succeeds).
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from delayq_local.exceptions import LocalStackError
from delayq_local.filters import kafka_view
from delayq_local.sandbox import LocalFunction
from delayq_local.sources.base import EventSource
from delayq_local.specs import KafkaEventSpec

log = logging.getLogger(__name__)

_TIMESTAMP_TYPES: Final = {
    TIMESTAMP_CREATE_TIME: "CREATE_TIME",
    TIMESTAMP_LOG_APPEND_TIME: "LOG_APPEND_TIME",
}
_METADATA_TIMEOUT_SECONDS: Final = 10.0
# With a batching window of 0, how long one wait for a first record lasts (then the stop flag
# is checked again).
_IDLE_WAIT_SECONDS: Final = 0.5


class KafkaEventSource(EventSource):
    """Consumes the event's topics in a consumer group and invokes the function per batch."""

    def __init__(
        self,
        function: LocalFunction,
        spec: KafkaEventSpec,
        bootstrap_servers: str,
        *,
        consumers: int = 1,
        retry_backoff_seconds: float = 1.0,
        consumer_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{function.name}:{spec.name}", function, environments=consumers)
        self.spec = spec
        self.bootstrap_servers = bootstrap_servers
        self.group_id = spec.consumer_group_id or f"{function.name}-{spec.name}"
        self._retry_backoff = retry_backoff_seconds
        self.consumers = consumers
        self._owned: dict[int, int] = {}
        self._owned_changed = threading.Condition()
        # A Lambda invocation may run up to its timeout between two polls.
        poll_interval_ms = max(300_000, int(function.timeout_seconds * 1000) + 60_000)
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest" if self._from_start else "latest",
            "max.poll.interval.ms": poll_interval_ms,
            **(consumer_config or {}),
        }

    @property
    def _from_start(self) -> bool:
        return self.spec.starting_position == "TRIM_HORIZON"

    def wait_assigned(self, timeout: float) -> bool:
        """Wait until every consumer owns partitions and knows where to start reading (with no
        more consumers than partitions, that is the group's settled assignment)."""

        def settled() -> bool:
            owners = [n for n in self._owned.values() if n > 0]
            return len(owners) == self.consumers

        with self._owned_changed:
            return self._owned_changed.wait_for(settled, timeout)

    def _work(self, index: int) -> None:
        consumer = Consumer(self._config)

        def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self._start_positions(consumer, partitions)
            self._record_ownership(index, len(partitions))

        def revoked(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
            self._record_ownership(index, 0)

        try:
            consumer.subscribe(list(self.spec.topics), on_assign=assigned, on_revoke=revoked)
            while self._active():
                messages = self._gather(consumer)
                batch = [m for m in messages if self._usable(m)]
                if batch:
                    self._process(index, consumer, batch)
        finally:
            consumer.close()

    def _gather(self, consumer: Consumer) -> list[Message]:
        """One batch: what arrives within the batching window, up to `BatchSize` records. With
        a window of 0, Lambda invokes as soon as records arrive: wait for the first, then take
        only what is already fetched."""
        window = self.spec.batching_window_seconds
        if window > 0:
            return list(consumer.consume(num_messages=self.spec.batch_size, timeout=window))
        first = consumer.consume(num_messages=1, timeout=_IDLE_WAIT_SECONDS)
        if not first or self.spec.batch_size == 1:
            return list(first)
        rest = consumer.consume(num_messages=self.spec.batch_size - 1, timeout=0)
        return [*first, *rest]

    def _record_ownership(self, index: int, partitions: int) -> None:
        with self._owned_changed:
            self._owned[index] = partitions
            self._owned_changed.notify_all()

    def _start_positions(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # With no committed offset, pin the start now and commit it: "latest" must mean the end
        # of the log when the group first got the partition, not whenever the first fetch (or
        # a rebalance to another consumer of the group) happens to run.
        starts = consumer.committed(partitions, timeout=_METADATA_TIMEOUT_SECONDS)
        pinned = []
        for tp in starts:
            if tp.offset < 0:
                if self._from_start:
                    tp.offset = OFFSET_BEGINNING
                else:
                    _, high = consumer.get_watermark_offsets(tp, timeout=_METADATA_TIMEOUT_SECONDS)
                    tp.offset = high
                    pinned.append(TopicPartition(tp.topic, tp.partition, high))
        consumer.assign(starts)
        if pinned:
            # Asynchronous: a commit inside the rebalance callback can meet the next rebalance.
            consumer.commit(offsets=pinned, asynchronous=True)

    def _usable(self, message: Message) -> bool:
        error = message.error()
        if error is None:
            return True
        self.stats.add("consumer_errors")
        log.info("%s: consumer error %s", self.name, error)
        return False

    def _process(self, index: int, consumer: Consumer, batch: Sequence[Message]) -> None:
        records = [self._record(m) for m in batch]
        if self.spec.filter is not None:
            kept = [r for r in records if self.spec.filter.matches(kafka_view(r))]
            self.stats.add("filtered", len(records) - len(kept))
            records = kept
        if records:
            invocation = self._invoke(index, self._event(records), len(records))
            if not invocation.ok:
                self._rewind(consumer, batch)
                self.stats.add("redelivered_batches")
                self._sleep(self._retry_backoff)
                return
        self._commit(consumer, batch)

    def _event(self, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            grouped.setdefault(f"{record['topic']}-{record['partition']}", []).append(record)
        event: dict[str, Any] = {
            "eventSource": "aws:kafka" if self.spec.kind == "MSK" else "SelfManagedKafka",
            "bootstrapServers": self.bootstrap_servers,
            "records": grouped,
        }
        if self.spec.kind == "MSK":
            event["eventSourceArn"] = self.spec.source_arn or ""
        return event

    @staticmethod
    def _record(message: Message) -> dict[str, Any]:
        topic, partition, offset = _position(message)
        timestamp_type, timestamp = message.timestamp()
        headers = message.headers() or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        record: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "timestamp": timestamp,
            "timestampType": _TIMESTAMP_TYPES.get(timestamp_type, "NO_TIMESTAMP_TYPE"),
            "headers": [{name: java_bytes(value)} for name, value in pairs],
        }
        key, value = message.key(), message.value()
        if key is not None:
            record["key"] = base64.b64encode(key).decode()
        if value is not None:
            record["value"] = base64.b64encode(value).decode()
        return record

    def _commit(self, consumer: Consumer, batch: Sequence[Message]) -> None:
        next_offsets: dict[tuple[str, int], int] = {}
        for m in batch:
            topic, partition, offset = _position(m)
            key = (topic, partition)
            next_offsets[key] = max(next_offsets.get(key, 0), offset + 1)
        offsets = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            # The records were processed; a later commit covers them, and until then a
            # rebalance may deliver them again (at least once).
            self.stats.add("commit_errors")
            log.warning("%s: commit failed: %s", self.name, e)

    def _rewind(self, consumer: Consumer, batch: Sequence[Message]) -> None:
        first: dict[tuple[str, int], int] = {}
        for m in batch:
            topic, partition, offset = _position(m)
            first[(topic, partition)] = min(first.get((topic, partition), offset), offset)
        for (topic, partition), offset in first.items():
            consumer.seek(TopicPartition(topic, partition, offset))


def _position(message: Message) -> tuple[str, int, int]:
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if topic is None or partition is None or offset is None:
        raise LocalStackError(f"consumed a message without a position: {message!r}")
    return topic, partition, offset


def java_bytes(value: bytes | str | None) -> list[int] | None:
    """Header bytes the way Lambda's (Java) serializer writes them: signed, -128..127."""
    if value is None:
        return None
    data = value.encode() if isinstance(value, str) else value
    return [b - 256 if b > 127 else b for b in data]
