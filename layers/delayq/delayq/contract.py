"""The message contract: a Kafka event record in, a typed delay request (or a rejection) out.

A delay request is an ordinary record on the delay topic: key and value are opaque bytes
delivered unchanged, user headers are kept in order, and ``delay-*`` control headers say where
and when. See ``docs/internals.md`` and the README for the full contract.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from delayq import constants as c
from delayq.exceptions import EnvelopeError, MalformedEventError
from delayq.settings import Settings

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
    # A copy made by a reschedule: that reschedule record's timestamp and coordinates (0 and
    # empty: not moved). ``ts_ms`` and ``src`` stay the original message's, so a cancel of
    # the original also cancels the copy (``delayq.store.Marker``).
    moved_ts_ms: int = 0
    moved_src: str = ""

    @property
    def owner(self) -> str:
        """The tenant: the ``delay-tenant`` header, else the target topic."""
        return self.tenant or self.target

    @property
    def release_at_ms(self) -> int:
        """When it may be produced: its due time, or the later slot a release cap gave it."""
        return max(self.due_ms, self.release_ms)

    @property
    def size(self) -> int:
        """Bytes of key, value and headers (what the payload limit counts)."""
        return len(self.key or b"") + len(self.value or b"") + headers_size(self.headers)


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
    """A control record asking to move the pending message ``delay_id``, stored for
    ``was_due_ms`` (its due time, or its release time when a release cap deferred it), to
    ``due_ms``. Like a cancel, it applies to the messages with that id written before it."""

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
    if not isinstance(record, Mapping):
        raise RejectedRecord(Reason.MALFORMED_RECORD, "record is not an object")
    source = _source(record, now_ms)
    headers = _headers(record.get("headers", []))
    control = _control_headers(headers)

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
    user_headers = tuple((n, v) for n, v in headers if not n.lower().startswith(c.HEADER_PREFIX))

    target = control.get(c.HEADER_TARGET, "").strip()
    if not target:
        raise RejectedRecord(Reason.MISSING_TARGET, "header delay-target is missing or empty")
    if not settings.target_allowed(target):
        raise RejectedRecord(
            Reason.TARGET_NOT_ALLOWED, f"target {target!r} is not on the allow-list"
        )

    due_ms = _due_ms(control, source.timestamp_ms)
    _check_delay(due_ms, settings, now_ms)

    delay_id = (
        _delay_id(control[c.HEADER_ID], "delay-id")
        if c.HEADER_ID in control
        else source.coordinates
    )
    request = DelayRequest(
        delay_id,
        target,
        due_ms,
        key,
        value,
        user_headers,
        source.coordinates,
        ts_ms=source.timestamp_ms,
        tenant=_tenant(control.get(c.HEADER_TENANT)),
        priority=_priority(control.get(c.HEADER_PRIORITY)),
    )
    if request.size > settings.max_payload_bytes:
        raise RejectedRecord(
            Reason.PAYLOAD_TOO_LARGE,
            f"key + value + headers are {request.size} bytes; "
            f"maximum is {settings.max_payload_bytes}",
        )
    # Key and headers stay inline even when the value is offloaded: count them as encoded
    # (base64, JSON escapes), so that a pointer envelope always fits an SQS body.
    inline = estimated_body_bytes(dataclasses.replace(request, value=None))
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
    milliseconds) and the new one (the usual due headers, relative ones counted from this
    record's timestamp). Its key, value and other headers are not used."""
    delay_id = _delay_id(control[c.HEADER_RESCHEDULE], "delay-reschedule")
    if c.HEADER_WAS_DUE not in control:
        raise RejectedRecord(
            Reason.MISSING_DUE,
            "delay-reschedule needs delay-was-due: the message's due time, epoch milliseconds",
        )
    was_due_ms = _header_ms(c.HEADER_WAS_DUE, control[c.HEADER_WAS_DUE], source.timestamp_ms)
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
        return base64.b64decode(raw, validate=True)
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
        if not isinstance(entry, Mapping):
            raise RejectedRecord(Reason.BAD_HEADERS, "a header entry is not an object")
        for name, value in entry.items():
            if not isinstance(name, str) or not name:
                raise RejectedRecord(Reason.BAD_HEADERS, "a header name is empty")
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
    # 0x80..0xFF arrive as -128..-1. Accept both notations of a byte.
    if not all(type(b) is int and -128 <= b <= 255 for b in value):
        raise RejectedRecord(Reason.BAD_HEADERS, f"header {name!r} has a non-byte value")
    return bytes(b & 0xFF for b in value)


def _control_headers(headers: Headers) -> dict[str, str]:
    control: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if not lowered.startswith(c.HEADER_PREFIX):
            continue
        if lowered in control:
            raise RejectedRecord(Reason.BAD_HEADERS, f"control header {lowered!r} appears twice")
        try:
            control[lowered] = (value or b"").decode("utf-8")
        except UnicodeDecodeError as e:
            raise RejectedRecord(Reason.BAD_HEADERS, f"header {lowered!r} is not UTF-8") from e
    return control


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
    if not value or len(value) > c.MAX_TENANT_LENGTH or not value.isprintable():
        raise RejectedRecord(
            Reason.BAD_TENANT,
            f"delay-tenant must be 1..{c.MAX_TENANT_LENGTH} printable characters",
        )
    return value


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


# --- the delay-queue envelope -----------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """What travels through the delay queue (and sits in the store): one delay request."""

    request: DelayRequest

    def encode(self) -> str:
        """The SQS body (JSON, version 1). ``ts``, ``pb`` (offloaded bytes), ``n`` (refused
        deliveries), ``rl`` (release time), ``tn`` (tenant), ``pr`` (priority), ``mt`` and ``ms``
        (the reschedule that moved it) are left out
        when they have their default: readers take the default for a missing one."""
        r = self.request
        body: dict[str, Any] = {
            "v": ENVELOPE_VERSION,
            "id": r.delay_id,
            "target": r.target,
            "due_ms": r.due_ms,
            "key": _enc(r.key),
            "value": _enc(r.value),
            "headers": [[n, _enc(v)] for n, v in r.headers],
            "payload_ref": r.payload_ref,
            "src": r.src,
        }
        for name, number in (
            ("ts", r.ts_ms),
            ("pb", r.offloaded_bytes),
            ("n", r.attempts),
            ("rl", r.release_ms),
            ("mt", r.moved_ts_ms),
        ):
            if number:
                body[name] = number
        if r.moved_src:
            body["ms"] = r.moved_src
        if r.tenant:
            body["tn"] = r.tenant
        if r.priority != c.PRIORITY_NORMAL:
            body["pr"] = r.priority
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def decode(cls, body: str) -> Envelope:
        """Parse a single-message (version 1) SQS body; raise :class:`EnvelopeError` if it
        is not one (a bundle is not: see :func:`decode_body`)."""
        try:
            d = json.loads(body)
        except ValueError as e:
            raise EnvelopeError(f"not a delay-queue envelope: {e}") from e
        return cls(_request_of(d))


ENVELOPE_VERSION = 1
BUNDLE_VERSION = 2
# A bundle body is this prefix, the entries joined by commas, and the suffix: its size is
# known from the entries' sizes without encoding it again.
BUNDLE_PREFIX = '{"v":2,"messages":['
BUNDLE_SUFFIX = "]}"


def bundle_bytes(entry_bytes: int, count: int) -> int:
    """The size of a bundle body holding ``count`` entries of ``entry_bytes`` in total."""
    return len(BUNDLE_PREFIX) + entry_bytes + max(0, count - 1) + len(BUNDLE_SUFFIX)


def encode_bundle(entries: Sequence[str]) -> str:
    """A bundle body (version 2) of encoded single envelopes (``Envelope.encode``): one SQS
    message for many requests. One entry is sent as it is: a bundle of one only costs bytes."""
    if len(entries) == 1:
        return entries[0]
    return BUNDLE_PREFIX + ",".join(entries) + BUNDLE_SUFFIX


@dataclass(frozen=True)
class BodyEntry:
    """One message of a delay-queue body: its request, or why it cannot be delivered.

    ``text`` is the entry as a single-message body of its own (for a bundle entry, the entry
    re-serialised as compact JSON: byte for byte what the sender encoded). It is what a
    reject keeps and what a re-send puts back on the delay queue, so a claim-check pointer
    travels as a pointer, never as the value it points at.
    """

    text: str
    request: DelayRequest | None = None
    error: str = ""


def decode_body(body: str) -> list[BodyEntry]:
    """Every message of a delay-queue body: a single envelope (version 1) or a bundle
    (version 2). Raises :class:`EnvelopeError` when the body as a whole is not ours; a bad
    entry of a good bundle comes back with its ``error`` and does not affect the others."""
    try:
        d = json.loads(body)
    except ValueError as e:
        raise EnvelopeError(f"not a delay-queue envelope: {e}") from e
    if isinstance(d, Mapping) and d.get("v") == BUNDLE_VERSION:
        return _bundle_entries(d)
    return [BodyEntry(body, _request_of(d))]


def _bundle_entries(d: Mapping[str, Any]) -> list[BodyEntry]:
    messages = d.get("messages")
    if set(d) != {"v", "messages"} or not isinstance(messages, list) or not messages:
        raise EnvelopeError(
            "not a delay-queue bundle: expected only 'v' and a non-empty 'messages' list"
        )
    if len(messages) > c.MAX_BUNDLE_ENTRIES:
        raise EnvelopeError(
            f"not a delay-queue bundle: {len(messages)} entries; at most {c.MAX_BUNDLE_ENTRIES}"
        )
    out: list[BodyEntry] = []
    for index, entry in enumerate(messages):
        text = json.dumps(entry, separators=(",", ":"))
        try:
            if not isinstance(entry, Mapping) or entry.get("v") != ENVELOPE_VERSION:
                raise EnvelopeError(f"entry {index} is not a version 1 envelope")
            out.append(BodyEntry(text, _request_of(entry)))
        except EnvelopeError as e:
            out.append(BodyEntry(text, error=f"bundle entry {index}: {e}"))
    return out


def _request_of(d: Any) -> DelayRequest:
    """The request of a decoded version 1 envelope; :class:`EnvelopeError` if it is not one."""
    try:
        if d.get("v") != ENVELOPE_VERSION:
            raise EnvelopeError(f"unknown envelope version {d.get('v')!r}")
        due_ms, ref = d["due_ms"], d.get("payload_ref")
        if not isinstance(due_ms, int) or isinstance(due_ms, bool):
            raise EnvelopeError(f"not a delay-queue envelope: due_ms {due_ms!r}")
        if ref is not None and not isinstance(ref, str):
            raise EnvelopeError("not a delay-queue envelope: payload_ref")
        return DelayRequest(
            delay_id=_delay_id_of(d),
            target=_text(d, "target"),
            due_ms=due_ms,
            key=_dec(d["key"]),
            value=_dec(d["value"]),
            headers=tuple((_name(n), _dec(v)) for n, v in d["headers"]),
            src=_text(d, "src"),
            payload_ref=ref,
            ts_ms=_count(d, "ts"),
            offloaded_bytes=_count(d, "pb"),
            attempts=_count(d, "n"),
            release_ms=_count(d, "rl"),
            moved_ts_ms=_count(d, "mt"),
            moved_src=_optional_text(d, "ms", ""),
            tenant=_optional_text(d, "tn", ""),
            priority=_known_priority(_optional_text(d, "pr", c.PRIORITY_NORMAL)),
        )
    except EnvelopeError:
        raise
    except (
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        OverflowError,
        binascii.Error,
    ) as e:
        raise EnvelopeError(f"not a delay-queue envelope: {e}") from e


def _count(d: Mapping[str, Any], name: str) -> int:
    value = d.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise EnvelopeError(f"not a delay-queue envelope: {name} {value!r}")
    return value


def _optional_text(d: Mapping[str, Any], name: str, default: str) -> str:
    value = d.get(name, default)
    if not isinstance(value, str):
        raise EnvelopeError(f"not a delay-queue envelope: {name} {value!r}")
    return value


def _known_priority(value: str) -> str:
    if value not in c.PRIORITIES:
        raise EnvelopeError(f"not a delay-queue envelope: priority {value!r}")
    return value


def _text(d: Mapping[str, Any], name: str) -> str:
    value = d[name]
    if not isinstance(value, str) or not value:
        raise EnvelopeError(f"not a delay-queue envelope: {name}")
    return value


def _delay_id_of(d: Mapping[str, Any]) -> str:
    value = _text(d, "id")
    if len(value.encode("utf-8", "surrogatepass")) > c.MAX_ID_BYTES:
        raise EnvelopeError("not a delay-queue envelope: id too long")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise EnvelopeError("not a delay-queue envelope: header name")
    return value


def _b64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


def _json_text_len(text: str) -> int:
    # Exact: json.dumps escapes non-ASCII (up to 12 characters for one code point).
    return len(json.dumps(text))


def _json_bytes_len(raw: bytes | None) -> int:
    return 4 if raw is None else 2 + _b64_len(len(raw))  # null, or quoted base64


def estimated_body_bytes(request: DelayRequest) -> int:
    """An upper bound of the encoded envelope size, without encoding it."""
    header_bytes = sum(_json_text_len(n) + 4 + _json_bytes_len(v) for n, v in request.headers)
    return (
        # The fixed field names and punctuation, the optional numbers and priority.
        256
        + 4 * 24
        + 16
        + _json_text_len(request.tenant)
        + _json_text_len(request.delay_id)
        + _json_text_len(request.target)
        + _json_text_len(request.src)
        + _json_text_len(request.moved_src)
        + _json_bytes_len(request.key)
        + _json_bytes_len(request.value)
        + header_bytes
        + _json_text_len(request.payload_ref or "")
    )


DEAD_LETTER_KEY = "dead_letter"


def dead_letter_text(entry_text: str, reason: str, detail: str, at_ms: int) -> str:
    """A single envelope as the emitter dead-letters it: the entry as it was queued (a
    claim-check pointer stays a pointer), with why and when under ``dead_letter``. Readers
    of envelopes ignore the extra key, so a redrive reads it like any other."""
    body = json.loads(entry_text)
    body[DEAD_LETTER_KEY] = {"reason": reason, "detail": detail, "at_ms": at_ms}
    return json.dumps(body, separators=(",", ":"))


def dead_letter_of(entry_text: str) -> Mapping[str, Any] | None:
    """The ``dead_letter`` record of an entry (None for one dead-lettered by SQS's redrive
    policy after ``maxReceiveCount`` receives: an invocation that crashed or timed out)."""
    try:
        body = json.loads(entry_text)
    except ValueError:
        return None
    found = body.get(DEAD_LETTER_KEY) if isinstance(body, Mapping) else None
    return found if isinstance(found, Mapping) else None


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


def _enc(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def _dec(text: Any) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text, validate=True)


def headers_json(headers: Headers) -> str:
    """Headers as stored in DynamoDB (a JSON list of ``[name, base64|null]``)."""
    return json.dumps([[n, _enc(v)] for n, v in headers], separators=(",", ":"))


def headers_from_json(text: str) -> Headers:
    """Inverse of :func:`headers_json`."""
    return tuple((str(n), _dec(v)) for n, v in json.loads(text))
