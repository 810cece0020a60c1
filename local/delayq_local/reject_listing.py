"""What the reject queue holds, for operators (`delayq rejects list`): each rejected record's
reason, detail, coordinates, id and decoded headers, read without consuming anything.

Messages are received hidden for a short while, then made visible again at once; each receive
counts towards a redrive policy's `maxReceiveCount` (the reject queue has none).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from delayq import constants as c
from delayq.retry import Deadline
from delayq_local.source_queue import SourceMessage, SourceQueue

__all__ = [
    "HOLD_SECONDS",
    "RejectView",
    "list_rejects",
]

# Received messages are hidden this long while the listing runs, then released.
HOLD_SECONDS: Final = 30
_PREVIEW_BYTES: Final = 60


@dataclass(frozen=True)
class RejectView:
    """One reject-queue message, decoded for reading."""

    message_id: str
    reason: str
    detail: str
    rejected_ms: int | None
    coordinates: str
    delay_id: str | None
    headers: tuple[tuple[str, str], ...]
    value_bytes: int | None
    value_preview: str
    record_ref: str | None

    @classmethod
    def of(cls, message: SourceMessage) -> RejectView:
        """Decode a reject body (an unreadable one is shown as such, not dropped)."""
        try:
            body = json.loads(message.body)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return cls(
                message.message_id, "unreadable", message.body[:200], None, "", None, (), None,
                "", None,
            )  # fmt: skip
        raw_source = body.get("source")
        source: dict[str, Any] = raw_source if isinstance(raw_source, dict) else {}
        raw_record = body.get("record")
        record: dict[str, Any] = raw_record if isinstance(raw_record, dict) else {}
        headers = _headers(record.get("headers") or [])
        value = _bytes(record.get("value"))
        return cls(
            message_id=message.message_id,
            reason=str(body.get("reason", "")),
            detail=str(body.get("detail", "")),
            rejected_ms=body.get("rejected_ms"),
            coordinates=f"{source.get('topic')}-{source.get('partition')}-{source.get('offset')}",
            delay_id=dict(headers).get(c.HEADER_ID),
            headers=headers,
            value_bytes=None if value is None else len(value),
            value_preview=_preview(value),
            record_ref=body.get("record_ref"),
        )

    def as_json(self) -> dict[str, Any]:
        """`delayq rejects list --json`: one object per message."""
        return {
            "message_id": self.message_id,
            "reason": self.reason,
            "detail": self.detail,
            "rejected_ms": self.rejected_ms,
            "coordinates": self.coordinates,
            "id": self.delay_id,
            "headers": dict(self.headers),
            "value_bytes": self.value_bytes,
            "value_preview": self.value_preview,
            "record_ref": self.record_ref,
        }

    def lines(self) -> list[str]:
        """The human form: reason and detail, then where the record came from and what it held."""
        where = f"{self.coordinates}" + (f"  id {self.delay_id}" if self.delay_id else "")
        size = "no value" if self.value_bytes is None else f"{self.value_bytes} B value"
        out = [f"{self.reason}: {self.detail}", f"    record {where}  {size} {self.value_preview}"]
        if self.headers:
            out.append("    headers " + ", ".join(f"{k}={v}" for k, v in self.headers))
        if self.record_ref:
            out.append(f"    the record is kept whole at {self.record_ref}")
        return out


def list_rejects(
    source: SourceQueue, limit: int, deadline: Deadline, wait_seconds: int = 1
) -> tuple[list[RejectView], list[str]]:
    """Up to `limit` reject-queue messages, decoded, and the errors of releasing them again."""
    held: dict[str, SourceMessage] = {}
    while len(held) < limit and not deadline.expired():
        received = source.receive(min(10, limit - len(held)), HOLD_SECONDS, wait_seconds, deadline)
        fresh = [m for m in received if m.message_id not in held]
        # A message received again (its hold ran out) is kept with its newest receipt handle,
        # the one its release must use.
        held.update((m.message_id, m) for m in received)
        if not fresh:
            break
    errors = source.release(list(held.values()), deadline) if held else []
    return [RejectView.of(m) for m in held.values()], errors


def _headers(raw: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            continue
        for name, value in entry.items():
            if value is None:
                out.append((str(name), "(null)"))
                continue
            try:
                data = bytes(v & 0xFF for v in value)
            except TypeError:
                out.append((str(name), repr(value)))
                continue
            out.append((str(name), data.decode("utf-8", errors="replace")))
    return tuple(out)


def _bytes(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


def _preview(value: bytes | None) -> str:
    if not value:
        return ""
    text = value[:_PREVIEW_BYTES].decode("utf-8", errors="replace")
    return repr(text) + ("..." if len(value) > _PREVIEW_BYTES else "")
