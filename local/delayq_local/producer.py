"""Writing delay requests, cancels and reschedules to the delay topic, with the contract's
headers."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from delayq import constants as c
from delayq_local.exceptions import LocalStackError

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Due:
    """When a request is due: exactly one of the three forms the contract accepts."""

    seconds: float | None = None
    ms: int | None = None
    at_ms: int | None = None

    def due_ms(self, timestamp_ms: int) -> int:
        """The due time ingest computes for a record with this timestamp."""
        if self.at_ms is not None:
            return self.at_ms
        if self.ms is not None:
            return timestamp_ms + self.ms
        return timestamp_ms + round((self.seconds or 0) * 1000)

    def header(self) -> Header:
        """The one control header that carries this due time."""
        given = [
            (name, value)
            for name, value in (
                (c.HEADER_DELAY_SECONDS, self.seconds),
                (c.HEADER_DELAY_MS, self.ms),
                (c.HEADER_DELIVER_AT, self.at_ms),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise LocalStackError("give exactly one of seconds, ms, at_ms")
        name, value = given[0]
        return name, str(value).encode()


@dataclass(frozen=True)
class Acknowledged:
    """Where the broker wrote a record."""

    topic: str
    partition: int
    offset: int
    # The record's timestamp (epoch ms): what a relative delay counts from.
    timestamp_ms: int = 0

    @property
    def coordinates(self) -> str:
        """`topic-partition-offset`: the delay id ingest gives a request sent without one."""
        return f"{self.topic}-{self.partition}-{self.offset}"


@dataclass
class DelayProducer:
    """A producer for the delay topic; delivery failures are collected, not raised mid-batch."""

    bootstrap_servers: str
    topic: str = "delay-requests"
    config: Mapping[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list, init=False)
    # The records the broker acknowledged, in the order of their delivery reports.
    acknowledged: list[Acknowledged] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._producer = Producer(
            {"bootstrap.servers": self.bootstrap_servers, "linger.ms": 5, **self.config}
        )

    def send(
        self,
        target: str,
        due: Due,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        delay_id: str | None = None,
        headers: Sequence[Header] = (),
    ) -> None:
        """Queue one delay request (call `flush()` to wait for the broker's acknowledgement)."""
        control: list[Header] = [(c.HEADER_TARGET, target.encode()), due.header()]
        if delay_id is not None:
            control.append((c.HEADER_ID, delay_id.encode()))
        self.send_raw([*headers, *control], value=value, key=key)

    def cancel(self, delay_id: str) -> None:
        """Queue a cancel record for `delay_id`."""
        self.send_raw([(c.HEADER_CANCEL, delay_id.encode())])

    def reschedule(self, delay_id: str, was_due_ms: int | None, due: Due) -> None:
        """Queue a reschedule record: move the pending `delay_id`, due at `was_due_ms` (epoch
        milliseconds; None: found by its id, with the stack's id index), to `due`."""
        headers: list[Header] = [(c.HEADER_RESCHEDULE, delay_id.encode())]
        if was_due_ms is not None:
            headers.append((c.HEADER_WAS_DUE, str(was_due_ms).encode()))
        self.send_raw([*headers, due.header()])

    def send_raw(
        self, headers: Sequence[Header], *, value: bytes | None = None, key: bytes | None = None
    ) -> None:
        """Queue a record with exactly these headers (invalid requests included)."""
        # The record's timestamp, set here: a relative delay counts from it, and `send` can say
        # the due time (librdkafka's mock cluster reports a fixed log-append time instead).
        timestamp_ms = int(time.time() * 1000)
        self._producer.produce(
            self.topic,
            value=value,
            key=key,
            headers=list(headers),
            timestamp=timestamp_ms,
            on_delivery=lambda error, message: self._delivered(error, message, timestamp_ms),
        )
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued record is acknowledged; raise if any is not."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise LocalStackError(f"{remaining} record(s) not acknowledged within {timeout}s")
        if self.failures:
            raise LocalStackError(f"{len(self.failures)} record(s) failed: {self.failures[0]}")

    def close(self) -> None:
        """Drop whatever is not sent yet and release the client (`flush()` first to keep it)."""
        self._producer.purge()
        self._producer.close()

    def _delivered(self, error: KafkaError | None, message: Message, timestamp_ms: int) -> None:
        if error is not None:
            self.failures.append(f"{message.topic()}: {error}")
        else:
            self.acknowledged.append(
                Acknowledged(
                    str(message.topic()),
                    message.partition() or 0,
                    message.offset() or 0,
                    timestamp_ms,
                )
            )

    def __enter__(self) -> DelayProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.flush()
        finally:
            self.close()
