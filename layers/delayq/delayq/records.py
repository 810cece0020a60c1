"""Records of the delay topic: a Kafka event record in, a typed delay request, cancel or
reschedule (or a rejection with its reason) out; and the headers of the record delivered.

A delay request is an ordinary record on the delay topic: key and value are opaque bytes
delivered unchanged, user headers are kept in order, and ``delay-*`` control headers say where
and when. See ``docs/internals.md`` and the README for the full contract. How a request travels
through the delay queue is :mod:`delayq.envelope`.
"""

from __future__ import annotations

import binascii
import enum
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from functools import cached_property
from typing import Any, Final

from delayq import constants as c
from delayq.exceptions import MalformedEventError
from delayq.settings import Settings

__all__ = [
    "CancelRequest",
    "ControlRequest",
    "DelayRequest",
    "Headers",
    "Reason",
    "RejectedRecord",
    "Rejection",
    "RescheduleRequest",
    "Source",
    "delivery_headers",
    "estimated_body_bytes",
    "headers_size",
    "iter_event_records",
    "parse_record",
    "plain_json_text",
    "rejection_of",
]

Headers = tuple[tuple[str, bytes | None], ...]


class Reason(enum.StrEnum):
    """Why a record was rejected (the ``reason`` field of the reject queue body)."""

    MALFORMED_RECORD = "malformed-record"
    BAD_BASE64 = "bad-base64"
    BAD_HEADERS = "bad-headers"
    MISSING_TARGET = "missing-target"
    TARGET_NOT_ALLOWED = "target-not-allowed"
    MISSING_DUE = "missing-due"
    BAD_DUE = "bad-due"
    CONFLICTING_DUE = "conflicting-due"
    DELAY_TOO_LONG = "delay-too-long"
    PAYLOAD_TOO_LARGE = "payload-too-large"
    BAD_ID = "bad-id"
    BAD_ENVELOPE = "bad-envelope"
    BAD_TENANT = "bad-tenant"
    BAD_PRIORITY = "bad-priority"
    QUOTA_EXCEEDED = "quota-exceeded"
    RESCHEDULE_NOT_FOUND = "reschedule-not-found"
    RESCHEDULE_CANCELLED = "reschedule-cancelled"
    RESCHEDULE_TOO_LATE = "reschedule-too-late"
    INTERNAL_ERROR = "internal-error"


class RejectedRecord(Exception):  # noqa: N818 -- a verdict on input, not a program error
    """Raised by :func:`parse_record` with a precise reason; never escapes a batch."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Source:
    """Where a record came from on the delay topic."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def coordinates(self) -> str:
        """``topic-partition-offset``: the default delay id and the ``src`` attribute."""
        return f"{self.topic}-{self.partition}-{self.offset}"


@dataclass(frozen=True)
class DelayRequest:
    """A message to deliver to ``target`` at ``due_ms`` (epoch milliseconds)."""

    delay_id: str
    target: str
    due_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    src: str
    payload_ref: str | None = None
    # The delay-topic record's timestamp: orders this message against cancels of its id (a
    # cancel applies to the messages with that id written before it). 0: unknown (an envelope
    # written before timestamps travelled), which every cancel of the id covers.
    ts_ms: int = 0
    # Bytes of the value kept in S3 (``payload_ref``): what delivering it costs in memory.
    offloaded_bytes: int = 0
    # Deliveries of this message that the target refused (it is dead-lettered at the limit).
    attempts: int = 0
    # Whose message it is (``delay-tenant``; empty: the target topic) and its class.
    tenant: str = ""
    priority: str = c.PRIORITY_NORMAL
    # When its tenant's release-rate cap lets it go (0: at its due time). Never before due.
    release_ms: int = 0
    # Its place among the messages its tenant's cap counted in its release second (from 0; -1:
    # not counted there: no cap, a reschedule's copy, a catch-up slot). Under strict caps, the
    # late messages that claimed that second go first: a rank past what they left waits.
    release_rank: int = -1
    # A later slot the emitter took for it from the same cap when it missed its release second
    # (the pipeline catching up; 0: none). It moves when the message goes, not its lateness,
    # which still counts from its release.
    paced_ms: int = 0
    # A copy made by a reschedule: that reschedule record's timestamp and coordinates (0 and
    # empty: not moved). ``ts_ms`` and ``src`` stay the original message's, so a cancel of
    # the original also cancels the copy (``delayq.store.Marker``).
    moved_ts_ms: int = 0
    moved_src: str = ""
    # When a delivery of it first failed for want of the target or a service it needs (0:
    # never): it is retried ``target_outage_max_seconds`` from then, however late it came.
    failing_since_ms: int = 0
    # False: never stored (queued by ingest, or delivered by its direct path), so no
    # reschedule can move it; a stored version can be moved until an emitter seals its
    # release second (``control_clock``).
    movable: bool = True

    @property
    def owner(self) -> str:
        """The tenant: the ``delay-tenant`` header, else the target topic."""
        return self.tenant or self.target

    @property
    def release_at_ms(self) -> int:
        """When it may be produced: its due time, or the later slot a release cap gave it."""
        return max(self.due_ms, self.release_ms, self.paced_ms)

    @cached_property
    def size(self) -> int:
        """Bytes of key, value and headers (what the payload limit counts). Kept once
        computed: ingest checks it when parsing and stores it with the message."""
        return len(self.key or b"") + len(self.value or b"") + headers_size(self.headers)

    @cached_property
    def inline_body_bytes(self) -> int:
        """:func:`estimated_body_bytes` with the value left out (offloaded). Kept once
        computed: ingest checks it when parsing and again when deciding to offload."""
        return _inline_body_bytes(self)


@dataclass(frozen=True)
class CancelRequest:
    """A control record asking to cancel the pending message ``delay_id``: every message with
    that id whose record was written before this one (``ts_ms``, then the offset on the same
    partition)."""

    delay_id: str
    src: str
    ts_ms: int = 0


@dataclass(frozen=True)
class RescheduleRequest:
    """A control record asking to move the pending message ``delay_id``, due at
    ``was_due_ms`` (0: not given, found by id), to ``due_ms``. Like a cancel, it applies to
    the messages with that id written before it."""

    delay_id: str
    was_due_ms: int
    due_ms: int
    src: str
    ts_ms: int = 0


@dataclass(frozen=True)
class Rejection:
    """A record that will not be delivered, with the original record kept whole."""

    reason: Reason
    detail: str
    record: Any
    topic: str | None
    partition: int | None
    offset: int | None


def headers_size(headers: Headers) -> int:
    """Bytes of header names and values."""
    return sum(len(name.encode()) + len(value or b"") for name, value in headers)


def delivery_headers(
    request: DelayRequest, emitted_ms: int, attempt: int
) -> list[tuple[str, bytes | None]]:
    """User headers in order, then the delivery headers consumers de-duplicate on."""
    headers = [
        *request.headers,
        (c.HEADER_ID, request.delay_id.encode()),
        (c.HEADER_DUE_MS, str(request.due_ms).encode()),
        (c.HEADER_EMITTED_MS, str(emitted_ms).encode()),
        (c.HEADER_ATTEMPT, str(attempt).encode()),
    ]
    if request.release_ms > request.due_ms:
        headers.append((c.HEADER_RELEASE_MS, str(request.release_ms).encode()))
    return headers


def _b64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


# The characters json.dumps writes as they are: printable ASCII but the quote and backslash.
_JSON_ESCAPED = re.compile(r"[^ !#-\[\]-~]")


def plain_json_text(text: str) -> bool:
    """Whether ``json.dumps`` writes ``text`` as it is, between quotes (nothing to escape)."""
    return _JSON_ESCAPED.search(text) is None


def _json_text_len(text: str) -> int:
    # Exact: json.dumps escapes quotes, backslashes, control characters and non-ASCII (up to
    # 12 characters for one code point); most texts have none of those.
    if plain_json_text(text):
        return len(text) + 2
    return len(json.dumps(text))


def _json_bytes_len(raw: bytes | None) -> int:
    return 4 if raw is None else 2 + _b64_len(len(raw))  # null, or quoted base64


def estimated_body_bytes(request: DelayRequest) -> int:
    """An upper bound of the size of the request's delay-queue envelope
    (``delayq.envelope.Envelope.encode``), without encoding it. It lives here because
    :func:`parse_record` checks it, and the envelope module builds on this one."""
    return request.inline_body_bytes - _json_bytes_len(None) + _json_bytes_len(request.value)


def _inline_body_bytes(request: DelayRequest) -> int:
    """:func:`estimated_body_bytes` of the request with its value left out (offloaded)."""
    header_bytes = sum(_json_text_len(n) + 4 + _json_bytes_len(v) for n, v in request.headers)
    texts = (
        request.tenant,
        request.delay_id,
        request.target,
        request.src,
        request.moved_src,
        request.payload_ref or "",
    )
    joined = "".join(texts)
    # One scan of all the texts: most have nothing json.dumps escapes.
    if _JSON_ESCAPED.search(joined) is None:
        text_bytes = len(joined) + 2 * len(texts)
    else:
        text_bytes = sum(_json_text_len(t) for t in texts)
    return (
        # The fixed field names and punctuation, the optional numbers and priority.
        256
        + 5 * 24
        + 16
        + text_bytes
        + _json_bytes_len(request.key)
        + _json_bytes_len(None)
        + header_bytes
    )


def iter_event_records(event: Any) -> Iterator[Any]:
    """Yield every record of an MSK or self-managed Kafka event, in partition order.

    A whole event that is not a Kafka event fails loudly: the invocation errors and the
    event source redelivers, so nothing is lost.
    """
    if not isinstance(event, Mapping) or not isinstance(event.get("records"), Mapping):
        raise MalformedEventError("not a Kafka event: expected a 'records' object")
    for partition_key, records in event["records"].items():
        if not isinstance(records, list):
            raise MalformedEventError(f"records[{partition_key!r}] is not a list")
        yield from records


ControlRequest = DelayRequest | CancelRequest | RescheduleRequest


def parse_record(record: Any, settings: Settings, now_ms: int) -> ControlRequest:
    """Validate one event record; raise :class:`RejectedRecord` with a precise reason."""
    if type(record) is not dict and not isinstance(record, Mapping):
        raise RejectedRecord(Reason.MALFORMED_RECORD, "record is not an object")
    source = _source(record, now_ms)
    headers = _headers(record.get("headers", []))
    control, user_headers = _split_headers(headers)

    if c.HEADER_CANCEL in control and c.HEADER_RESCHEDULE in control:
        raise RejectedRecord(Reason.BAD_HEADERS, "delay-cancel and delay-reschedule in one record")
    if c.HEADER_CANCEL in control:
        return CancelRequest(
            _delay_id(control[c.HEADER_CANCEL], "delay-cancel"),
            source.coordinates,
            source.timestamp_ms,
        )
    if c.HEADER_RESCHEDULE in control:
        return _reschedule(control, source, settings, now_ms)

    key = _b64(record.get("key"), "key")
    value = _b64(record.get("value"), "value")

    target = control.get(c.HEADER_TARGET, "").strip()
    if not target:
        raise RejectedRecord(Reason.MISSING_TARGET, "header delay-target is missing or empty")
    if not settings.target_allowed(target):
        raise RejectedRecord(
            Reason.TARGET_NOT_ALLOWED, f"target {target!r} is not on the allow-list"
        )

    due_ms = _due_ms(control, source.timestamp_ms)
    _check_delay(due_ms, settings, now_ms)

    coordinates = source.coordinates
    delay_id = (
        _delay_id(control[c.HEADER_ID], "delay-id") if c.HEADER_ID in control else coordinates
    )
    limits = settings.limits
    tenant = limits.tenant_of(_tenant(control.get(c.HEADER_TENANT)), source.topic)
    priority = _priority(control.get(c.HEADER_PRIORITY))
    if not limits.allows_priority(tenant or target, priority):
        raise RejectedRecord(
            Reason.BAD_PRIORITY, f"tenant {tenant or target!r} may not use priority {priority}"
        )
    request = DelayRequest(
        delay_id,
        target,
        due_ms,
        key,
        value,
        user_headers,
        coordinates,
        ts_ms=source.timestamp_ms,
        tenant=tenant,
        priority=priority,
    )
    if request.size > settings.max_payload_bytes:
        raise RejectedRecord(
            Reason.PAYLOAD_TOO_LARGE,
            f"key + value + headers are {request.size} bytes; "
            f"maximum is {settings.max_payload_bytes}",
        )
    # Key and headers stay inline even when the value is offloaded: count them as encoded
    # (base64, JSON escapes), so that a pointer envelope always fits an SQS body.
    inline = request.inline_body_bytes
    if inline > c.MAX_INLINE_KEY_AND_HEADERS_BYTES:
        raise RejectedRecord(
            Reason.PAYLOAD_TOO_LARGE,
            f"key + headers take {inline} bytes encoded; "
            f"maximum is {c.MAX_INLINE_KEY_AND_HEADERS_BYTES}",
        )
    return request


def _check_delay(due_ms: int, settings: Settings, now_ms: int) -> None:
    if due_ms - now_ms > settings.max_delay_seconds * 1000:
        raise RejectedRecord(
            Reason.DELAY_TOO_LONG,
            f"due {due_ms} is {(due_ms - now_ms) / 1000:.0f}s away; "
            f"maximum is {settings.max_delay_seconds}s",
        )


def _reschedule(
    control: Mapping[str, str], source: Source, settings: Settings, now_ms: int
) -> RescheduleRequest:
    """A ``delay-reschedule`` record: the id, the old due time (``delay-was-due``, epoch
    milliseconds; optional with the id index) and the new one (the usual due headers,
    relative ones counted from this record's timestamp). Its key, value and other headers
    are not used."""
    delay_id = _delay_id(control[c.HEADER_RESCHEDULE], "delay-reschedule")
    if c.HEADER_WAS_DUE in control:
        was_due_ms = _header_ms(c.HEADER_WAS_DUE, control[c.HEADER_WAS_DUE], source.timestamp_ms)
    elif settings.id_index:
        was_due_ms = 0  # found by its id (the id index)
    else:
        raise RejectedRecord(
            Reason.MISSING_DUE,
            "delay-reschedule needs delay-was-due (the message's due time, epoch milliseconds): "
            "this stack keeps no id index to find it by id alone (IdIndex=0)",
        )
    due_ms = _due_ms(control, source.timestamp_ms)
    _check_delay(due_ms, settings, now_ms)
    return RescheduleRequest(delay_id, was_due_ms, due_ms, source.coordinates, source.timestamp_ms)


def rejection_of(record: Any, error: RejectedRecord) -> Rejection:
    """Keep the original record and whatever coordinates it has, however broken it is."""
    coords: dict[str, Any] = {}
    if isinstance(record, Mapping):
        for name, kind in (("topic", str), ("partition", int), ("offset", int)):
            value = record.get(name)
            coords[name] = (
                value if isinstance(value, kind) and not isinstance(value, bool) else None
            )
    return Rejection(
        error.reason,
        error.detail,
        record,
        coords.get("topic"),
        coords.get("partition"),
        coords.get("offset"),
    )


def _source(record: Mapping[str, Any], now_ms: int) -> Source:
    topic = record.get("topic")
    if not isinstance(topic, str) or not topic:
        raise RejectedRecord(Reason.MALFORMED_RECORD, "field 'topic' is missing or not a string")
    partition, offset = _natural(record, "partition"), _natural(record, "offset")
    timestamp = record.get("timestamp")
    if timestamp is None or timestamp == -1:
        # No broker timestamp (NO_TIMESTAMP_TYPE): count relative delays from arrival.
        timestamp = now_ms
    if not isinstance(timestamp, int) or isinstance(timestamp, bool) or timestamp < 0:
        raise RejectedRecord(Reason.MALFORMED_RECORD, "field 'timestamp' is not epoch milliseconds")
    return Source(topic, partition, offset, timestamp)


def _natural(record: Mapping[str, Any], name: str) -> int:
    value = record.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RejectedRecord(Reason.MALFORMED_RECORD, f"field {name!r} is not an integer >= 0")
    return value


def _b64(raw: Any, name: str) -> bytes | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise RejectedRecord(Reason.BAD_BASE64, f"{name} is not a base64 string")
    try:
        # What base64.b64decode(raw, validate=True) does, without its two Python frames (it
        # raises the same ValueError for a non-ASCII text).
        return binascii.a2b_base64(raw, strict_mode=True)
    except (binascii.Error, ValueError) as e:
        raise RejectedRecord(Reason.BAD_BASE64, f"{name} is not valid base64: {e}") from e


def _headers(raw: Any) -> Headers:
    """Headers as AWS shows them: a list of one-entry objects, values as byte arrays."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RejectedRecord(Reason.BAD_HEADERS, "headers is not a list")
    out: list[tuple[str, bytes | None]] = []
    for entry in raw:
        # The exact type first: isinstance against an ABC costs more than the rest.
        if type(entry) is not dict and not isinstance(entry, Mapping):
            raise RejectedRecord(Reason.BAD_HEADERS, "a header entry is not an object")
        for name, value in entry.items():
            if not isinstance(name, str) or not name:
                raise RejectedRecord(Reason.BAD_HEADERS, "a header name is empty")
            if not name.isascii():
                try:
                    name.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise RejectedRecord(Reason.BAD_HEADERS, "a header name is not UTF-8") from e
            out.append((name, _header_value(name, value)))
    return tuple(out)


def _header_value(name: str, value: Any) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RejectedRecord(Reason.BAD_HEADERS, f"header {name!r} is not a byte array")
    # Lambda's Kafka event sources serialise header values as Java bytes, which are signed:
    # 0x80..0xFF arrive as -128..-1. Accept both notations of a byte (and nothing else: not
    # a bool, whatever Python thinks of it).
    if value and set(map(type, value)) != {int}:
        raise _not_bytes(name)
    try:
        return bytes(value)  # 0..255 only
    except ValueError:
        if min(value) < -128 or max(value) > 255:
            raise _not_bytes(name) from None
        return bytes(b & 0xFF for b in value)


def _not_bytes(name: str) -> RejectedRecord:
    return RejectedRecord(Reason.BAD_HEADERS, f"header {name!r} has a non-byte value")


def _split_headers(headers: Headers) -> tuple[dict[str, str], Headers]:
    """``(control headers by lower-case name, as text; the user headers in order)``, in one
    pass."""
    control: dict[str, str] = {}
    user: list[tuple[str, bytes | None]] = []
    for header in headers:
        name, value = header
        lowered = name.lower()
        if not lowered.startswith(c.HEADER_PREFIX):
            user.append(header)
            continue
        if lowered in control:
            raise RejectedRecord(Reason.BAD_HEADERS, f"control header {lowered!r} appears twice")
        try:
            control[lowered] = (value or b"").decode("utf-8")
        except UnicodeDecodeError as e:
            raise RejectedRecord(Reason.BAD_HEADERS, f"header {lowered!r} is not UTF-8") from e
    return control, tuple(user)


def _delay_id(raw: str, header: str) -> str:
    value = raw.strip()
    problem = (
        f"{header} must be 1..{c.MAX_ID_LENGTH} printable characters "
        f"and at most {c.MAX_ID_BYTES} bytes of UTF-8"
    )
    if not value or len(value) > c.MAX_ID_LENGTH or not value.isprintable():
        raise RejectedRecord(Reason.BAD_ID, problem)
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RejectedRecord(Reason.BAD_ID, problem) from e
    if len(encoded) > c.MAX_ID_BYTES:  # DynamoDB's sort key limit
        raise RejectedRecord(Reason.BAD_ID, problem)
    return value


def _tenant(raw: str | None) -> str:
    if raw is None:
        return ""
    value = raw.strip()
    if (
        not value
        or len(value) > c.MAX_TENANT_LENGTH
        or not value.isprintable()
        or any(ch in value for ch in _KEY_CHARACTERS)
    ):
        raise RejectedRecord(
            Reason.BAD_TENANT,
            f"delay-tenant must be 1..{c.MAX_TENANT_LENGTH} printable characters, "
            f"none of {' '.join(_KEY_CHARACTERS)}",
        )
    return value


# Characters of the table's internal keys (``rate#<tenant>/deferred#<second>``) and of the
# limits' own names (``*``): a tenant named with one could share another's counters.
_KEY_CHARACTERS: Final = ("#", "/", "*")


def _priority(raw: str | None) -> str:
    if raw is None:
        return c.PRIORITY_NORMAL
    value = raw.strip().lower()
    if value not in c.PRIORITIES:
        raise RejectedRecord(
            Reason.BAD_PRIORITY,
            f"delay-priority={raw[:32]!r}: one of {', '.join(c.PRIORITIES)}",
        )
    return value


def _due_ms(control: Mapping[str, str], timestamp_ms: int) -> int:
    given = [
        h for h in (c.HEADER_DELIVER_AT, c.HEADER_DELAY_SECONDS, c.HEADER_DELAY_MS) if h in control
    ]
    if not given:
        raise RejectedRecord(
            Reason.MISSING_DUE, "one of delay-deliver-at, delay-seconds, delay-ms is required"
        )
    if len(given) > 1:
        raise RejectedRecord(
            Reason.CONFLICTING_DUE, f"more than one due header: {', '.join(given)}"
        )
    return _header_ms(given[0], control[given[0]], timestamp_ms)


def _header_ms(header: str, raw: str, timestamp_ms: int) -> int:
    """The epoch-millisecond time a due header says (relative ones from ``timestamp_ms``)."""
    text = raw.strip()
    pattern = _DECIMAL if header == c.HEADER_DELAY_SECONDS else _INTEGER
    if not pattern.fullmatch(text):
        raise RejectedRecord(Reason.BAD_DUE, f"{header}={text[:64]!r} is not a plain number")
    if text.startswith("-"):
        raise RejectedRecord(Reason.BAD_DUE, f"{header}={text[:64]!r} is negative")
    if len(text.partition(".")[0].lstrip("0")) > _MAX_DUE_DIGITS:
        # Longer than any epoch-ms time or delay this side of the year 33,000: no float maths.
        raise RejectedRecord(Reason.DELAY_TOO_LONG, f"{header} has too many digits")
    if header == c.HEADER_DELAY_SECONDS:
        # Exact decimal, rounded up to the millisecond: never earlier than asked.
        delay_ms = int((Decimal(text) * 1000).to_integral_value(rounding=ROUND_CEILING))
        return timestamp_ms + delay_ms
    number = int(text.lstrip("0") or "0")  # at most 15 digits left: int() has a length cap
    if header in (c.HEADER_DELIVER_AT, c.HEADER_WAS_DUE):
        if number == 0:
            raise RejectedRecord(
                Reason.BAD_DUE, f"{header}={text[:64]!r} is not epoch milliseconds"
            )
        return number
    return timestamp_ms + number


# Plain ASCII decimals only: no signs but '-', no exponents, no '1_000', no other digits.
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]{1,9})?", re.ASCII)
_MAX_DUE_DIGITS = 15
