"""The delay-queue envelope: how a delay request travels through the delay queue and sits in
the store.

A single message is a version 1 envelope (compact JSON, bytes as base64); a bundle (version 2)
packs many of them into one SQS body. Also here: the dead-letter record the emitter adds to an
entry, and headers as stored in DynamoDB. The request it carries is
:class:`delayq.records.DelayRequest`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from delayq import constants as c
from delayq.exceptions import EnvelopeError
from delayq.records import DelayRequest, Headers, plain_json_text

# Compact JSON: ``json.dumps`` with separators builds a new encoder on every call, and
# envelopes and stored headers are encoded once per message.
_COMPACT_JSON: Final = json.JSONEncoder(separators=(",", ":"))

__all__ = [
    "BUNDLE_PREFIX",
    "BUNDLE_SUFFIX",
    "BUNDLE_VERSION",
    "DEAD_LETTER_KEY",
    "ENVELOPE_VERSION",
    "BodyEntry",
    "Envelope",
    "bundle_bytes",
    "dead_letter_of",
    "dead_letter_text",
    "decode_body",
    "encode_bundle",
    "headers_from_json",
    "headers_json",
]


@dataclass(frozen=True)
class Envelope:
    """What travels through the delay queue (and sits in the store): one delay request."""

    request: DelayRequest

    def encode(self) -> str:
        """The SQS body (JSON, version 1). ``ts``, ``pb`` (offloaded bytes), ``n`` (refused
        deliveries), ``rl`` (release time), ``rk`` (release rank), ``pc`` (the emitter's
        catch-up slot), ``tn`` (tenant), ``pr`` (priority), ``mt`` and ``ms`` (the reschedule
        that moved it), ``fs`` (its first failed delivery), ``im`` (1: not movable, never
        stored) are left out when they have their default: readers take the default for a
        missing one."""
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
            ("pc", r.paced_ms),
            ("mt", r.moved_ts_ms),
            ("fs", r.failing_since_ms),
        ):
            if number:
                body[name] = number
        if r.release_rank >= 0:
            body["rk"] = r.release_rank
        if r.moved_src:
            body["ms"] = r.moved_src
        if r.tenant:
            body["tn"] = r.tenant
        if r.priority != c.PRIORITY_NORMAL:
            body["pr"] = r.priority
        if not r.movable:
            body["im"] = 1
        return _COMPACT_JSON.encode(body)

    @classmethod
    def decode(cls, body: str) -> Envelope:
        """Parse a single-message (version 1) SQS body; raise :class:`EnvelopeError` if it
        is not one (a bundle is not: see :func:`decode_body`)."""
        return cls(_request_of(_json_of(body)))


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
    d = _json_of(body)
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
        text = _COMPACT_JSON.encode(entry)
        try:
            if not isinstance(entry, Mapping) or entry.get("v") != ENVELOPE_VERSION:
                raise EnvelopeError(f"entry {index} is not a version 1 envelope")
            out.append(BodyEntry(text, _request_of(entry)))
        except EnvelopeError as e:
            out.append(BodyEntry(text, error=f"bundle entry {index}: {e}"))
    return out


def _json_of(body: str) -> Any:
    """The parsed JSON of a body; :class:`EnvelopeError` if it is not JSON."""
    try:
        return json.loads(body)
    except ValueError as e:
        raise EnvelopeError(f"not a delay-queue envelope: {e}") from e


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
            release_rank=_count(d, "rk") if "rk" in d else -1,
            paced_ms=_count(d, "pc"),
            moved_ts_ms=_count(d, "mt"),
            moved_src=_optional_text(d, "ms", ""),
            failing_since_ms=_count(d, "fs"),
            tenant=_optional_text(d, "tn", ""),
            priority=_known_priority(_optional_text(d, "pr", c.PRIORITY_NORMAL)),
            movable=_count(d, "im") != 1,
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


DEAD_LETTER_KEY = "dead_letter"


def dead_letter_text(entry_text: str, reason: str, detail: str, at_ms: int) -> str:
    """A single envelope as the emitter dead-letters it: the entry as it was queued (a
    claim-check pointer stays a pointer), with why and when under ``dead_letter``. Readers
    of envelopes ignore the extra key, so a redrive reads it like any other."""
    body = json.loads(entry_text)
    body[DEAD_LETTER_KEY] = {"reason": reason, "detail": detail, "at_ms": at_ms}
    return _COMPACT_JSON.encode(body)


def dead_letter_of(entry_text: str) -> Mapping[str, Any] | None:
    """The ``dead_letter`` record of an entry (None for one dead-lettered by SQS's redrive
    policy after ``maxReceiveCount`` receives: an invocation that crashed or timed out)."""
    try:
        body = json.loads(entry_text)
    except ValueError:
        return None
    found = body.get(DEAD_LETTER_KEY) if isinstance(body, Mapping) else None
    return found if isinstance(found, Mapping) else None


def _enc(raw: bytes | None) -> str | None:
    # base64.b64encode without its Python frame.
    return None if raw is None else binascii.b2a_base64(raw, newline=False).decode("ascii")


def _dec(text: Any) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text, validate=True)


def headers_json(headers: Headers) -> str:
    """Headers as stored in DynamoDB (a JSON list of ``[name, base64|null]``)."""
    if all(plain_json_text(n) for n, _ in headers):
        # The encoder's exact text, built directly: names need no escapes and base64 never
        # does (an encoder call costs more than the rest of a typical header list).
        return (
            "["
            + ",".join(f'["{n}",null]' if v is None else f'["{n}","{_enc(v)}"]' for n, v in headers)
            + "]"
        )
    return _COMPACT_JSON.encode([[n, _enc(v)] for n, v in headers])


def headers_from_json(text: str) -> Headers:
    """Inverse of :func:`headers_json`."""
    return tuple((str(n), _dec(v)) for n, v in json.loads(text))
