"""The benchmark workload: the reference delay mix, 1 KB messages, and the events Lambda would
deliver for them (Kafka batches for ingest, SQS batches for the emitter).

Everything is deterministic (seeded); building events is never part of a timed region.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from delayq.envelope import Envelope
from delayq.records import DelayRequest
from testkit import events
from testkit.clock import NOW_MS
from testkit.payload import order_event

DAY_SECONDS: Final = 86_400
DELAY_TOPIC: Final = "delay-requests"
TARGET: Final = "orders.timeout"
ALLOWED_TARGETS: Final = ("orders.*", "reminders")
DELAY_QUEUE_ARN: Final = "arn:aws:sqs:us-east-1:123456789012:delayq-delay"

# A "1 KB message": key + value + user headers = 1,024 bytes (what the payload limit counts);
# the value is a JSON order event (testkit.payload), one of VALUE_VARIANTS.
KEY_BYTES: Final = 16
USER_HEADERS: Final = (("trace-id", b"0123456789abcdef"),)
MESSAGE_BYTES: Final = 1024
VALUE_BYTES: Final = MESSAGE_BYTES - KEY_BYTES - sum(len(n) + len(v) for n, v in USER_HEADERS)
VALUE_VARIANTS: Final = 1024


def message_value(index: int, size: int = VALUE_BYTES) -> bytes:
    """The value of workload message ``index``: an order event of ``size`` bytes (1,024
    distinct events, so that building large workloads stays cheap)."""
    return _variant(index % VALUE_VARIANTS, size)


@cache
def _variant(slot: int, size: int) -> bytes:
    return order_event(slot, size)


@dataclass(frozen=True)
class DelayBand:
    """A share of the traffic with delays uniform in ``[min_s, max_s)``."""

    name: str
    share: float
    min_s: float
    max_s: float

    @property
    def mean_s(self) -> float:
        """The mean delay of the band."""
        return (self.min_s + self.max_s) / 2


@dataclass(frozen=True)
class Workload:
    """A daily volume, a delay mix and a message size (the reference workload by default)."""

    messages_per_day: float = 100e6
    bands: tuple[DelayBand, ...] = (
        DelayBand("under 15 min", 0.20, 1.0, 900.0),
        DelayBand("1-24 h", 0.50, 3_600.0, 86_400.0),
        DelayBand("1-7 days", 0.30, 86_400.0, 7 * 86_400.0),
    )
    message_bytes: int = MESSAGE_BYTES
    horizon_seconds: int = 900

    @property
    def per_second(self) -> float:
        """Average messages per second."""
        return self.messages_per_day / DAY_SECONDS

    @property
    def short_share(self) -> float:
        """Share of messages due within the horizon (they never touch DynamoDB)."""
        return sum(b.share for b in self.bands if b.max_s <= self.horizon_seconds)

    @property
    def long_share(self) -> float:
        """Share of messages stored in DynamoDB until the scheduler queues them."""
        return 1.0 - self.short_share

    @property
    def long_per_second(self) -> float:
        """Stored messages falling due per second at steady state."""
        return self.per_second * self.long_share

    @property
    def mean_delay_s(self) -> float:
        """The mean delay over the mix."""
        return sum(b.share * b.mean_s for b in self.bands)

    def describe(self) -> str:
        """One line for reports."""
        mix = ", ".join(f"{b.share:.0%} {b.name}" for b in self.bands)
        return (
            f"{self.messages_per_day / 1e6:.0f} M messages/day ({self.per_second:,.0f}/s); "
            f"delays {mix}; {self.message_bytes} B messages"
        )


REFERENCE_MIX = Workload()


def kafka_record(
    offset: int,
    *,
    deliver_at_ms: int | None = None,
    delay_ms: int | None = None,
    cancel: str | None = None,
    delay_id: str | None = None,
    timestamp_ms: int = NOW_MS,
    partition: int = 0,
) -> dict[str, Any]:
    """A 1 KB delay request (or a cancel) as the Kafka event source delivers it."""
    control: dict[str, str] = {}
    if cancel is not None:
        control["cancel"] = cancel
    else:
        control["target"] = TARGET
        if deliver_at_ms is not None:
            control["deliver_at"] = str(deliver_at_ms)
        else:
            control["ms"] = str(delay_ms or 0)
        if delay_id is not None:
            control["id"] = delay_id
    key = f"key-{offset:012d}".encode()[:KEY_BYTES].ljust(KEY_BYTES, b"-")
    return events.kafka_record(
        offset=offset,
        partition=partition,
        topic=DELAY_TOPIC,
        timestamp=timestamp_ms,
        key=key,
        value=message_value(offset) if cancel is None else b"",
        headers=[events.header(n, v) for n, v in USER_HEADERS],
        **control,
    )


def batched(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def mixed_delays_ms(count: int, workload: Workload, rng: random.Random) -> list[int]:
    """``count`` delays drawn from the workload's mix (exact shares, shuffled)."""
    delays: list[int] = []
    for band in workload.bands:
        n = round(count * band.share)
        delays.extend(int(rng.uniform(band.min_s, band.max_s) * 1000) for _ in range(n))
    delays = (delays + delays[: max(0, count - len(delays))])[:count]
    rng.shuffle(delays)
    return delays


def delay_request(index: int, due_ms: int, value: bytes | None = None) -> DelayRequest:
    """A parsed 1 KB delay request (what the scheduler reads and the emitter decodes); the
    value is :func:`message_value` unless given."""
    key = f"key-{index:012d}".encode()[:KEY_BYTES].ljust(KEY_BYTES, b"-")
    return DelayRequest(
        delay_id=f"{DELAY_TOPIC}-0-{index}",
        target=TARGET,
        due_ms=due_ms,
        key=key,
        value=message_value(index) if value is None else value,
        headers=USER_HEADERS,
        src=f"{DELAY_TOPIC}-0-{index}",
    )


def sqs_record(
    index: int, body: str, receive_count: int = 1, sent_ms: int = NOW_MS
) -> dict[str, Any]:
    """One record of an SQS event from the delay queue, as the Lambda event source delivers
    it."""
    return events.sqs_record(
        message_id=f"00000000-0000-4000-8000-{index:012d}",
        receipt_handle=f"rh-{index}",
        body=body,
        source_arn=DELAY_QUEUE_ARN,
        receive_count=receive_count,
        sent_ms=sent_ms,
    )


def emitter_events(messages: int, batch: int, due_ms: int, start: int = 0) -> list[dict[str, Any]]:
    """SQS events of ``batch`` delay-queue envelopes each, all due at ``due_ms``."""
    records = [
        sqs_record(i, Envelope(delay_request(i, due_ms)).encode())
        for i in range(start, start + messages)
    ]
    return [{"Records": chunk} for chunk in batched(records, batch)]
