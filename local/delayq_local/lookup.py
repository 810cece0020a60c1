"""Where one message is, by id, for operators (`delayq get`): what the table can say, and what
nothing can.

Knowable with strongly consistent reads of the table:

- the id's control item: its latest cancel and reschedule (every message with the id written
  before them is dropped; a reschedule says where it moved the message);
- with the id index (`IdIndex=1`; `delayq local` keeps it), every message ingest stored or
  queued with the id: its due and release times, whether it still waits in the table or the
  scheduler has sent it to the delay queue, and whether a cancel or reschedule drops it;
- without the index, the message stored for a due time, when that due time is given (stored
  messages are keyed by due-second and shard).

Not knowable: whether a message was delivered (the target topic has it: `delayq tail`), and
whether it was rejected (the reject queue: `delayq rejects list`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from delayq import buckets
from delayq.ordering import Marker, version_order
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.store import Located, MessageStore, Watermark
from delayq_local.timefmt import iso_ms

__all__ = [
    "UNKNOWABLE",
    "Whereabouts",
    "locate",
    "waiting",
]

UNKNOWABLE: Final = (
    "delivered: the target topic has it (`delayq tail --from-beginning` shows deliveries)",
    "rejected: the reject queue has it (`delayq rejects list` shows it)",
)
NO_INDEX: Final = (
    "no message with this id is indexed: the stack keeps no id index (IdIndex=0: pass --due), "
    "or the message was delivered directly, expired after delivery, or never arrived"
)


@dataclass(frozen=True)
class Whereabouts:
    """What the table says about one id (and one due time, when given)."""

    delay_id: str
    due_ms: int | None
    marker: Marker | None
    stored: DelayRequest | None
    second_scheduled: bool | None
    # The id index's entries (oldest first) and the scheduler's progress, to place them.
    located: tuple[Located, ...] = ()
    watermark: Watermark | None = None

    @property
    def found(self) -> bool:
        """Whether the table knows anything about the id."""
        return self.marker is not None or self.stored is not None or bool(self.located)

    def state_of(self, loc: Located) -> str:
        """Where an indexed message is: ``queued`` (sent to the delay queue by ingest),
        ``sent`` (by the scheduler), ``waiting`` (in the table), ``dropped`` (a cancel or
        reschedule applies), ``expired`` (its item is gone: delivered long ago)."""
        marker = self.marker
        if loc.queued:
            # Queued whole: only its record time is indexed, which a later control covers.
            controls = [m for m in (marker.cancel, marker.moved) if m] if marker else []
            return "dropped" if any(ts > loc.ts_ms for ts, _ in controls) else "queued"
        if loc.stored is None:
            return "expired"
        if marker is not None and marker.applies(loc.stored):
            return "dropped"
        second = buckets.due_second(loc.stored.release_at_ms)
        return (
            "sent" if self.watermark is not None and self.watermark.scheduled(second) else "waiting"
        )

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
            "indexed": [
                {
                    "due_ms": loc.due_ms,
                    "release_ms": loc.release_ms,
                    "written_ms": loc.ts_ms,
                    "state": self.state_of(loc),
                    "moved_by": loc.stored.moved_src if loc.stored else None,
                }
                for loc in self.located
            ],
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
        out.extend(self._indexed_lines())
        if self.due_ms is not None and self.stored is None:
            out.append(
                f"  stored     nothing for {iso_ms(self.due_ms)}: it was due within the horizon "
                "when ingested (delay queue), has another due time, was removed by TTL after "
                "its due time, or never arrived"
            )
        elif self.stored is not None:
            s = self.stored
            state = "sent to the delay queue" if self.second_scheduled else "waiting"
            fate = " (will be dropped: a cancel or reschedule applies)" if self.dropped else ""
            out.append(
                f"  stored     due {iso_ms(s.due_ms)} for {s.target}, {_size(s)} bytes, "
                f"written {iso_ms(s.ts_ms)}; {state}{fate}"
            )
        out.extend(f"  unknown    {line}" for line in UNKNOWABLE)
        return out

    def _indexed_lines(self) -> list[str]:
        if not self.located:
            return [] if self.due_ms is not None else [f"  indexed    {NO_INDEX}"]
        lines = []
        for loc in self.located:
            state = {
                "queued": "in the delay queue (ingest sent it there: due within the horizon)",
                "sent": "in the delay queue (the scheduler sent it)",
                "waiting": "waiting in the table",
                "dropped": "will be dropped: a cancel or reschedule applies",
                "expired": "gone from the table (its time passed long ago)",
            }[self.state_of(loc)]
            release = (
                f", released {iso_ms(loc.release_ms)} (its cap)"
                if loc.release_ms > loc.due_ms
                else ""
            )
            moved = (
                f", moved here by {loc.stored.moved_src}"
                if loc.stored and loc.stored.moved_src
                else ""
            )
            lines.append(
                f"  indexed    due {iso_ms(loc.due_ms)}{release}, written {iso_ms(loc.ts_ms)}"
                f"{moved}: {state}"
            )
        return lines


def locate(
    store: MessageStore, delay_id: str, due_ms: int | None, deadline: Deadline
) -> Whereabouts:
    """Read what the table holds about `delay_id` (strongly consistent)."""
    marker = store.markers([delay_id], deadline).get(delay_id)
    located = tuple(
        sorted(store.located([delay_id], deadline)[delay_id], key=lambda loc: loc.ts_ms)
    )
    watermark = store.read_watermark(deadline) if located else None
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
    return Whereabouts(delay_id, due_ms, marker, stored, scheduled, located, watermark)


def waiting(found: Whereabouts, now_ms: int) -> list[Located]:
    """The indexed messages that still wait for their time (stored or queued, not dropped):
    what a cancel written now would stop."""
    return [
        loc
        for loc in found.located
        if (state := found.state_of(loc)) in ("waiting", "sent", "queued")
        and (state == "waiting" or loc.release_ms > now_ms)
    ]


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
