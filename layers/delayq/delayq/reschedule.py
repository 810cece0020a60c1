"""Reschedule by id: the layer logic behind ``delay-reschedule`` records (run by ingest).

A reschedule moves the pending message with its id from its old due time to a new one. Ingest
reads the stored message at the old time (strongly consistent), records the reschedule in the
id's marker item (the item cancels use: the emitter and the direct path read it for every
message already, so a message never rescheduled costs nothing more), then keeps a copy of the
message at the new time like a new message (direct, queued or stored). The marker supersedes
every version of the message written before the reschedule, wherever it waits (the store, an
SQS bundle, a dead-letter queue); the copy is the version it names. The copy keeps the
original's record time, so a cancel of the original also cancels the copy.

The guarantee: a reschedule is applied when ingest records it at least the emitter's hold plus
``RESCHEDULE_MARGIN_MS`` before the message's old release time; no emitter reads the old
version's marker earlier (it reads markers only within its hold of the release time, and the
margin covers clock differences and the write's latency), so the message goes at the new time
and not at the old one. A reschedule that comes
later is refused (``reschedule-too-late``, the record kept in the reject queue): the message
goes at its old time, once. See ``docs/internals.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from delayq import constants as c
from delayq.clock import Clock
from delayq.records import DelayRequest, Reason, RejectedRecord, RescheduleRequest
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import Marker, MessageStore, cancel_covers

__all__ = [
    "RescheduleOutcome",
    "copy_of",
    "latest_per_id",
    "reschedule",
]


@dataclass
class RescheduleOutcome:
    """What a batch's reschedules did: the copies to keep at their new times, the records
    refused (by their coordinates), and how many a later reschedule of their id overrides."""

    copies: list[DelayRequest] = field(default_factory=list)
    # The stored messages the copies were made of, in the same order.
    originals: list[DelayRequest] = field(default_factory=list)
    refused: dict[str, RejectedRecord] = field(default_factory=dict)
    superseded: int = 0
    # Copies already kept by an earlier run of the same record (a redelivered batch).
    repeated: int = 0


def latest_per_id(reschedules: Sequence[RescheduleRequest]) -> list[RescheduleRequest]:
    """The last-written reschedule of each id (ties: the later one in the batch, which is
    the later offset on one partition)."""
    latest: dict[str, RescheduleRequest] = {}
    for r in reschedules:
        kept = latest.get(r.delay_id)
        if kept is None or r.ts_ms >= kept.ts_ms:
            latest[r.delay_id] = r
    return list(latest.values())


def reschedule(
    reschedules: Sequence[RescheduleRequest],
    *,
    store: MessageStore,
    settings: Settings,
    clock: Clock,
    deadline: Deadline,
) -> RescheduleOutcome:
    """Apply a batch's reschedules; the caller keeps ``copies`` and rejects ``refused``.

    Raises when the store cannot be read or a marker not written in time (the batch is then
    redelivered: a reschedule whose marker was written is completed, whatever the time).
    """
    outcome = RescheduleOutcome()
    latest = latest_per_id(reschedules)
    outcome.superseded = len(reschedules) - len(latest)
    wanted = [(r.delay_id, at) for r in latest for at in (r.was_due_ms, r.due_ms)]
    stored = store.messages_at(wanted, deadline)
    markers = store.markers([r.delay_id for r in latest], deadline)
    now_ms = clock()
    to_record: list[tuple[RescheduleRequest, DelayRequest, Deadline]] = []
    for r in latest:
        marker = markers.get(r.delay_id, Marker())
        if marker.superseded(r):
            outcome.superseded += 1
            continue
        done = stored.get((r.delay_id, r.due_ms))
        if done is not None and (done.moved_ts_ms, done.moved_src) == (r.ts_ms, r.src):
            outcome.repeated += 1
            continue
        message = _movable(r, stored.get((r.delay_id, r.was_due_ms)), marker, settings, now_ms)
        if isinstance(message, RejectedRecord):
            outcome.refused[r.src] = message
            continue
        cutoff = _cutoff_ms(message, settings)
        recording = deadline if marker.rescheduled_by(r) else _until(deadline, clock, cutoff)
        to_record.append((r, message, recording))
    recorded = store.put_reschedules([(r, d) for r, _, d in to_record], clock())
    for (r, message, _), applied in zip(to_record, recorded, strict=True):
        if applied:
            outcome.copies.append(copy_of(message, r))
            outcome.originals.append(message)
        else:
            outcome.superseded += 1
    return outcome


def copy_of(message: DelayRequest, reschedule: RescheduleRequest) -> DelayRequest:
    """The message at its new time, named by the reschedule that moved it. Its record time,
    payload pointer and tenant stay; a release slot of the old time does not apply."""
    return dataclasses.replace(
        message,
        due_ms=reschedule.due_ms,
        release_ms=0,
        attempts=0,
        moved_ts_ms=reschedule.ts_ms,
        moved_src=reschedule.src,
    )


def _movable(
    r: RescheduleRequest,
    message: DelayRequest | None,
    marker: Marker,
    settings: Settings,
    now_ms: int,
) -> DelayRequest | RejectedRecord:
    """The stored ``message`` when ``r`` can move it, else why not."""
    if message is None or not cancel_covers(r.ts_ms, r.src, message):
        # A message sent after the reschedule (reusing the id) is a new message.
        return RejectedRecord(
            Reason.RESCHEDULE_NOT_FOUND,
            f"no message {r.delay_id!r} sent before this reschedule is stored for "
            f"{r.was_due_ms} (delay-was-due): it was delivered, never sent, or due within the "
            "horizon when it was sent (it waits in the delay queue, where it cannot be moved)",
        )
    if marker.cancel is not None and cancel_covers(*marker.cancel, message):
        return RejectedRecord(
            Reason.RESCHEDULE_CANCELLED,
            f"message {r.delay_id!r} was cancelled (cancel record {marker.cancel[1]})",
        )
    cutoff = _cutoff_ms(message, settings)
    if not marker.rescheduled_by(r) and now_ms >= cutoff:
        return RejectedRecord(
            Reason.RESCHEDULE_TOO_LATE,
            f"message {r.delay_id!r} is released at {message.release_at_ms}; a reschedule "
            f"must be recorded by {cutoff}, it came at {now_ms}: it is delivered at its old time",
        )
    return message


def _cutoff_ms(message: DelayRequest, settings: Settings) -> int:
    """The last moment a reschedule of ``message`` may be recorded: before any emitter can
    have read the old version's marker."""
    return message.release_at_ms - settings.max_hold_ms - c.RESCHEDULE_MARGIN_MS


def _until(deadline: Deadline, clock: Clock, cutoff_ms: int) -> Deadline:
    """``deadline``, shortened to end at ``cutoff_ms`` on ``clock``: a marker write is not
    tried after the cutoff (the batch fails, and its retry refuses the reschedule unless
    the write went through after all)."""
    return Deadline(lambda: min(int(deadline.remaining_seconds() * 1000), cutoff_ms - clock()), 0)
