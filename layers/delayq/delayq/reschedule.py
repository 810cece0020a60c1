"""Reschedule by id: the layer logic behind ``delay-reschedule`` records (run by ingest).

A reschedule moves the pending message with its id from its old due time to a new one. Ingest
reads the stored message at the old time (strongly consistent), records the reschedule in the
id's marker item (the item cancels use: the emitter and the direct path read it for every
message already, so a message never rescheduled costs nothing more), then keeps a copy of the
message at the new time like a new message (direct, queued or stored). The marker supersedes
every version of the message written before the reschedule, wherever it waits (the store, an
SQS bundle, a dead-letter queue); the copy is the version it names. The copy keeps the
original's record time, so a cancel of the original also cancels the copy.

The guarantee: a reschedule ingest takes up at least the emitter's hold plus
``RESCHEDULE_MARGIN_MS`` before the message's old release time is applied when its marker
lands before an emitter reads the old version's markers (an emitter seals the release second
first, and a marker written after that fails: ``delayq.control_clock``). Otherwise it is
refused (``reschedule-too-late``, the record kept in the reject queue) and the message goes at
its old time, once: never at both. See ``docs/internals.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from delayq import buckets
from delayq import constants as c
from delayq.buckets import due_second
from delayq.clock import Clock
from delayq.exceptions import StoreError
from delayq.ordering import Marker, cancel_covers, record_order, version_order
from delayq.records import DelayRequest, Reason, RejectedRecord, RescheduleRequest
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import MessageStore, RescheduleWrite

__all__ = [
    "RescheduleOutcome",
    "chains",
    "copy_of",
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
    # Refused as too late, with the version each would have moved.
    too_late: list[tuple[RescheduleRequest, DelayRequest]] = field(default_factory=list)


def chains(reschedules: Sequence[RescheduleRequest]) -> list[list[RescheduleRequest]]:
    """The reschedules of each id in the records' own order (``ordering.record_order``),
    whatever order the batch holds them in."""
    per_id: dict[str, list[RescheduleRequest]] = {}
    for r in reschedules:
        per_id.setdefault(r.delay_id, []).append(r)
    return [sorted(chain, key=_order) for chain in per_id.values()]


def reschedule(
    reschedules: Sequence[RescheduleRequest],
    *,
    store: MessageStore,
    settings: Settings,
    clock: Clock,
    deadline: Deadline,
) -> RescheduleOutcome:
    """Apply a batch's reschedules; the caller keeps ``copies`` and rejects ``refused``.

    The reschedules of one id are applied in their records' order, each to the version the
    ones before it left (T0->T1 then T1->T2 in one batch ends at T2); only the last one
    applied is recorded. Raises when the store cannot be read or a marker not written in time
    (the batch is then redelivered: a reschedule whose marker was written is completed,
    whatever the time).
    """
    outcome = RescheduleOutcome()
    per_id = chains(reschedules)
    # What each moves (no delay-was-due: found by id, below), and what is already at each new
    # time (a redelivered reschedule's copy: never placed away by a cap).
    old = [(r.delay_id, r.was_due_ms) for chain in per_id for r in chain if r.was_due_ms]
    new = [(r.delay_id, r.due_ms) for chain in per_id for r in chain]
    stored = {
        **store.versions_at(new, deadline, placed=False),
        **store.versions_at(old, deadline),
    }
    by_id = [chain[0].delay_id for chain in per_id if any(not r.was_due_ms for r in chain)]
    for delay_id, located in (store.located(by_id, deadline) if by_id else {}).items():
        stored[(delay_id, 0)] = [loc.stored for loc in located if loc.stored is not None]
    markers = store.markers([chain[0].delay_id for chain in per_id], deadline)
    now_ms = clock()
    # (reschedule, version it moves, its copy, deadline of its write; None: recorded already)
    to_record: list[tuple[RescheduleRequest, DelayRequest, DelayRequest, Deadline | None]] = []
    for chain in per_id:
        marker = markers.get(chain[0].delay_id, Marker())
        applied = _resolve(
            chain, stored=stored, marker=marker, settings=settings, now_ms=now_ms, outcome=outcome
        )
        if applied is None:
            continue
        r, base, copy = applied
        if any(
            v.moved_src and version_order(v) == _order(r) for v in stored[(r.delay_id, r.due_ms)]
        ):
            outcome.repeated += 1
            continue
        # A marker an earlier run wrote held when it landed (no emitter had sealed the old
        # second): it is not written again, only completed.
        recording = (
            None
            if marker.rescheduled_by(r)
            else _until(deadline, clock, _cutoff_ms(base, settings))
        )
        to_record.append((r, base, copy, recording))
    if outcome.too_late:
        _fence(outcome.too_late, store, settings.shards, clock, deadline)
    writes = iter(
        store.put_reschedules(
            [(r, due_second(b.release_at_ms), d) for r, b, _, d in to_record if d is not None],
            clock(),
        )
    )
    for r, base, copy, recording in to_record:
        written = RescheduleWrite.RECORDED if recording is None else next(writes)
        if written is RescheduleWrite.RECORDED:
            outcome.copies.append(copy)
            outcome.originals.append(base)
        elif written is RescheduleWrite.SUPERSEDED:
            outcome.superseded += 1
        else:
            outcome.refused[r.src] = RejectedRecord(
                Reason.RESCHEDULE_TOO_LATE,
                f"the release second of message {r.delay_id!r} ({base.release_at_ms}) was "
                "sealed for delivery before this reschedule's marker was written: it is "
                "delivered at its old time",
            )
    return outcome


def _fence(
    too_late: Sequence[tuple[RescheduleRequest, DelayRequest]],
    store: MessageStore,
    shards: int,
    clock: Clock,
    deadline: Deadline,
) -> None:
    """Before refusing reschedules as too late: seal their old release seconds, so that a
    marker write of an earlier run that has not landed yet never will, then read the markers
    again. Raises (the batch is retried, and completes the move) when one landed."""
    seals: dict[int, int] = {}
    for r, base in too_late:
        shard = buckets.shard_of(r.delay_id, shards)
        seals[shard] = max(seals.get(shard, 0), due_second(base.release_at_ms))
    store.seal(seals, clock(), deadline)
    markers = store.markers([r.delay_id for r, _ in too_late], deadline)
    landed = [r.src for r, _ in too_late if markers.get(r.delay_id, Marker()).rescheduled_by(r)]
    if landed:
        raise StoreError(f"reschedules {landed} were recorded by an earlier run: retry the batch")


def _resolve(
    chain: list[RescheduleRequest],
    *,
    stored: Mapping[tuple[str, int], list[DelayRequest]],
    marker: Marker,
    settings: Settings,
    now_ms: int,
    outcome: RescheduleOutcome,
) -> tuple[RescheduleRequest, DelayRequest, DelayRequest] | None:
    """Apply one id's chain in memory: ``(the last reschedule applied, the stored version it
    moves away from, its copy)``, or None when none applies. Refusals and steps a later
    reschedule overrides are counted in ``outcome``."""
    mine = {_order(r) for r in chain}
    if marker.moved is not None and record_order(*marker.moved) not in mine:
        live = [r for r in chain if not marker.superseded(r)]
        outcome.superseded += len(chain) - len(live)
    else:
        live = chain
    # The steps up to the one the marker holds were decided by the run that recorded it (a
    # redelivered batch): applied again whatever the time, so that the recorded move is
    # completed rather than refused.
    recorded = [i for i, r in enumerate(live) if marker.rescheduled_by(r)]
    decided = recorded[-1] if recorded else -1
    made: list[tuple[DelayRequest, DelayRequest]] = []  # (stored base, in-memory copy)
    last: tuple[RescheduleRequest, DelayRequest, DelayRequest] | None = None
    for i, r in enumerate(live):
        candidates = [*stored[(r.delay_id, r.was_due_ms)]]
        candidates += [
            copy
            for _, copy in made
            if not r.was_due_ms or due_second(copy.due_ms) == due_second(r.was_due_ms)
        ]
        message = _movable(r, candidates, marker, settings, now_ms, decided=i <= decided)
        if isinstance(message, tuple):
            outcome.refused[r.src], base = message
            outcome.too_late.append((r, base))
            continue
        if isinstance(message, RejectedRecord):
            outcome.refused[r.src] = message
            continue
        base = next((b for b, made_copy in made if made_copy is message), message)
        copy = copy_of(message, r)
        made.append((base, copy))
        if last is not None:
            outcome.superseded += 1
        last = (r, base, copy)
    return last


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
    candidates: Sequence[DelayRequest],
    marker: Marker,
    settings: Settings,
    now_ms: int,
    *,
    decided: bool,
) -> DelayRequest | RejectedRecord | tuple[RejectedRecord, DelayRequest]:
    """The version ``r`` moves (the latest written before it among ``candidates``: the
    versions of its id at its old time), else why not (with the version, when too late).
    ``decided``: a run recorded ``r`` or a later step of its chain already (no cutoff)."""
    before = [v for v in candidates if _version_before(v, r)]
    if not before and not r.was_due_ms:
        return RejectedRecord(
            Reason.RESCHEDULE_NOT_FOUND,
            f"no stored message {r.delay_id!r} sent before this reschedule is in the id index: "
            "it was delivered, never sent, due within the horizon when it was sent (it waits "
            "in the delay queue, where it cannot be moved), or stored before the index was on",
        )
    if not before:
        # A message sent after the reschedule (reusing the id) is a new message.
        return RejectedRecord(
            Reason.RESCHEDULE_NOT_FOUND,
            f"no message {r.delay_id!r} sent before this reschedule is stored for "
            f"{r.was_due_ms} (delay-was-due): it was delivered, never sent, or due within the "
            "horizon when it was sent (it waits in the delay queue, where it cannot be moved)",
        )
    message = max(before, key=version_order)
    if marker.cancel is not None and cancel_covers(*marker.cancel, message):
        return RejectedRecord(
            Reason.RESCHEDULE_CANCELLED,
            f"message {r.delay_id!r} was cancelled (cancel record {marker.cancel[1]})",
        )
    cutoff = _cutoff_ms(message, settings)
    if not decided and now_ms >= cutoff:
        return RejectedRecord(
            Reason.RESCHEDULE_TOO_LATE,
            f"message {r.delay_id!r} is released at {message.release_at_ms}; a reschedule "
            f"must be recorded by {cutoff}, it came at {now_ms}: it is delivered at its old time",
        ), message
    return message


def _order(r: RescheduleRequest) -> tuple[int, str, int, int]:
    return record_order(r.ts_ms, r.src)


def _version_before(v: DelayRequest, r: RescheduleRequest) -> bool:
    """Whether version ``v`` was written before reschedule ``r``."""
    if v.moved_src:
        return version_order(v) < _order(r)
    return cancel_covers(r.ts_ms, r.src, v)


def _cutoff_ms(message: DelayRequest, settings: Settings) -> int:
    """The last moment a reschedule of ``message`` may be recorded: before any emitter can
    have read the old version's marker."""
    return message.release_at_ms - settings.max_hold_ms - c.RESCHEDULE_MARGIN_MS


def _until(deadline: Deadline, clock: Clock, cutoff_ms: int) -> Deadline:
    """``deadline``, shortened to end at ``cutoff_ms`` on ``clock``: a marker write is not
    tried after the cutoff (the batch fails, and its retry refuses the reschedule unless
    the write went through after all)."""
    return Deadline(lambda: min(int(deadline.remaining_seconds() * 1000), cutoff_ms - clock()), 0)
