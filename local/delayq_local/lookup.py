"""Where one message is, by id, for operators (`delayq get`): what the table can say, and what
nothing can.

Knowable with strongly consistent reads of the table:

- the id's control item: its latest cancel and reschedule (every message with the id written
  before them is dropped; a reschedule says where it moved the message);
- the message stored for a due time, when that due time is given (stored messages are keyed by
  due-second and shard, so without it there is nothing to read but the whole table), and
  whether the scheduler has passed its second (sent it to the delay queue).

Not knowable: whether a message is in the delay queue (SQS cannot be searched, and messages due
within the horizon travel there in bundles), whether it was delivered (the target topic has it:
`delayq tail`), and whether it was rejected (the reject queue: `delayq redrive rejects
--dry-run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from delayq import buckets
from delayq.ordering import Marker, version_order
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.store import MessageStore
from delayq_local.timefmt import iso_ms

__all__ = [
    "UNKNOWABLE",
    "Whereabouts",
    "locate",
]

UNKNOWABLE: Final = (
    "in the delay queue: cannot be looked up (SQS cannot be searched; messages due within the "
    "horizon travel there in bundles)",
    "delivered: the target topic has it (`delayq tail --from-beginning` shows deliveries)",
    "rejected: the reject queue has it (`delayq redrive rejects --dry-run` lists it)",
)


@dataclass(frozen=True)
class Whereabouts:
    """What the table says about one id (and one due time, when given)."""

    delay_id: str
    due_ms: int | None
    marker: Marker | None
    stored: DelayRequest | None
    second_scheduled: bool | None

    @property
    def found(self) -> bool:
        """Whether the table knows anything about the id."""
        return self.marker is not None or self.stored is not None

    @property
    def dropped(self) -> bool | None:
        """Whether the stored message will not be delivered (a cancel or reschedule applies);
        None when nothing is stored for the due time asked."""
        if self.stored is None:
            return None
        return self.marker is not None and self.marker.applies(self.stored)

    def as_json(self) -> dict[str, Any]:
        """`delayq get --json`."""
        marker = self.marker
        stored = self.stored
        return {
            "id": self.delay_id,
            "found": self.found,
            "cancel": _control(marker.cancel) if marker else None,
            "reschedule": (
                {**(_control(marker.moved) or {}), "moved_to_ms": marker.moved_due_ms}
                if marker and marker.moved
                else None
            ),
            "stored": _stored(stored, self.second_scheduled) if stored else None,
            "due_ms_asked": self.due_ms,
            "dropped": self.dropped,
            "unknowable": list(UNKNOWABLE),
        }

    def lines(self) -> list[str]:
        """The human answer."""
        out = [f"{self.delay_id}:"]
        marker = self.marker
        if marker is not None and marker.cancel is not None:
            ts, src = marker.cancel
            out.append(
                f"  cancelled  by the record written {iso_ms(ts)} ({src or 'an early marker'}): "
                "every message with this id written before it is dropped"
            )
        if marker is not None and marker.moved is not None:
            ts, src = marker.moved
            to = iso_ms(marker.moved_due_ms) if marker.moved_due_ms is not None else "?"
            out.append(f"  rescheduled to {to} by the record written {iso_ms(ts)} ({src})")
        if self.due_ms is None:
            out.append(
                "  stored     not looked up: pass --due (stored messages are keyed by due time)"
            )
        elif self.stored is None:
            out.append(
                f"  stored     nothing for {iso_ms(self.due_ms)}: it was due within the horizon "
                "when ingested (delay queue), has another due time, was removed by TTL after "
                "its due time, or never arrived"
            )
        else:
            s = self.stored
            state = "sent to the delay queue" if self.second_scheduled else "waiting"
            fate = " (will be dropped: a cancel or reschedule applies)" if self.dropped else ""
            out.append(
                f"  stored     due {iso_ms(s.due_ms)} for {s.target}, {_size(s)} bytes, "
                f"written {iso_ms(s.ts_ms)}; {state}{fate}"
            )
        out.extend(f"  unknown    {line}" for line in UNKNOWABLE)
        return out


def locate(
    store: MessageStore, delay_id: str, due_ms: int | None, deadline: Deadline
) -> Whereabouts:
    """Read what the table holds about `delay_id` (strongly consistent)."""
    marker = store.markers([delay_id], deadline).get(delay_id)
    stored = None
    scheduled = None
    if due_ms is not None:
        versions = store.versions_at([(delay_id, due_ms)], deadline)[(delay_id, due_ms)]
        # The latest written: the one a reschedule of the id would move.
        stored = max(versions, key=version_order, default=None)
        if stored is not None:
            watermark = store.read_watermark(deadline)
            second = buckets.due_second(due_ms)
            scheduled = watermark is not None and watermark.scheduled(second)
    return Whereabouts(delay_id, due_ms, marker, stored, scheduled)


def _control(pair: tuple[int, str] | None) -> dict[str, Any] | None:
    if pair is None:
        return None
    return {"written_ms": pair[0], "record": pair[1]}


def _stored(request: DelayRequest, scheduled: bool | None) -> dict[str, Any]:
    return {
        "due_ms": request.due_ms,
        "target": request.target,
        "bytes": _size(request),
        "written_ms": request.ts_ms,
        "record": request.src,
        "tenant": request.tenant,
        "priority": request.priority,
        "scheduled": scheduled,
    }


def _size(request: DelayRequest) -> int:
    return request.offloaded_bytes or len(request.value or b"")
