"""Ingest: a Kafka batch from the delay topic -> the target topic itself (due within the direct
window, ``delayq.direct``), SQS (due soon), DynamoDB (due later), cancel markers, and the reject
queue. Valid records are never dropped: if one cannot be
stored after retries, the invocation fails and the event source redelivers the batch
(re-storing is idempotent: same id, same due, same item; due-soon messages are queued again,
a duplicate with the same ``delay-id``).

A record ingest cannot handle at all (a bug the contract's checks did not foresee) is
rejected with reason ``internal-error`` and its original bytes, like any invalid record:
one record must not block its partition. Only a failure to keep valid records (DynamoDB,
SQS or S3 unavailable) fails the batch, which blocks the partition until the service is
back: nothing is lost, and the template alarms on it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from delayq import buckets
from delayq import constants as c
from delayq.clock import Clock, Sleep
from delayq.direct import DirectServices, deliver_direct, is_direct
from delayq.exceptions import WatermarkConflictError
from delayq.payloads import PayloadStore, written_no_earlier_ms
from delayq.pending import PendingCounts, PendingTally
from delayq.producing import Delivery
from delayq.queues import DelayQueue, RejectQueue
from delayq.records import (
    CancelRequest,
    DelayRequest,
    Reason,
    RejectedRecord,
    Rejection,
    RescheduleRequest,
    estimated_body_bytes,
    iter_event_records,
    parse_record,
    rejection_of,
)
from delayq.reschedule import reschedule
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.shaping import Shaper, missed_slot_cap
from delayq.store import MessageStore, Watermark

__all__ = [
    "Control",
    "IngestResult",
    "IngestServices",
    "cancel",
    "ingest_batch",
    "needs_offload",
    "parse_batch",
]


@dataclass
class IngestResult:
    """What one batch did (counted into metrics by the handler)."""

    queued: int = 0
    stored: int = 0
    cancelled: int = 0
    # Reschedules applied (a copy kept at the new time); refused ones are in ``rejected``.
    rescheduled: int = 0
    offloaded: int = 0
    rescued: int = 0  # stored below a watermark that moved meanwhile, so also queued
    rejected: list[Rejection] = field(default_factory=list)
    # Tenant limits: released after due by a release cap; accepted over quota (deferred).
    capped: int = 0
    deferred: int = 0
    # The direct path (due within the direct window): produced by ingest itself.
    deliveries: list[Delivery] = field(default_factory=list)
    direct_cancelled: int = 0
    direct_fallback: int = 0  # could not be produced here: queued for the emitter instead
    pending_updates: int = 0  # writes of the pending counts
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class IngestServices:
    """The adapters ingest writes to; ``direct`` produces due-now messages (None: every
    message goes through the delay queue)."""

    store: MessageStore
    delay_queue: DelayQueue
    rejects: RejectQueue
    payloads: PayloadStore
    direct: DirectServices | None = None
    # Applies the tenant limits (None: no tenant has one).
    shaper: Shaper | None = None
    # Keeps the pending counts per period and target (None: not kept, nothing tallied).
    pending: PendingCounts | None = None


def needs_offload(request: DelayRequest, settings: Settings) -> bool:
    """Large values go to S3: above the threshold, or when the envelope would not fit SQS."""
    if request.value is None:
        return False
    return (
        len(request.value) > settings.offload_threshold_bytes
        or estimated_body_bytes(request) > c.SQS_MAX_MESSAGE_BYTES
    )


Control = CancelRequest | RescheduleRequest


def parse_batch(
    event: Any, settings: Settings, now_ms: int
) -> tuple[list[DelayRequest], list[Control], list[Rejection]]:
    """Split an event into delay requests, control records (cancels, reschedules) and
    rejections (bad records never raise)."""
    delays: list[DelayRequest] = []
    controls: list[Control] = []
    rejections: list[Rejection] = []
    for record in iter_event_records(event):
        try:
            parsed = parse_record(record, settings, now_ms)
        except RejectedRecord as e:
            rejections.append(rejection_of(record, e))
            continue
        except Exception as e:  # noqa: BLE001 -- kept whole in the reject queue, never dropped
            detail = f"ingest could not read the record: {type(e).__name__}: {e}"
            rejections.append(rejection_of(record, RejectedRecord(Reason.INTERNAL_ERROR, detail)))
            continue
        if isinstance(parsed, DelayRequest):
            delays.append(parsed)
        else:
            controls.append(parsed)
    return delays, controls, rejections


def ingest_batch(
    event: Any,
    *,
    settings: Settings,
    services: IngestServices,
    clock: Clock,
    deadline: Deadline,
    sleep: Sleep = time.sleep,
) -> IngestResult:
    """Process one Kafka event-source batch. Raises if a valid record could not be kept."""
    delays, controls, rejections = parse_batch(event, settings, clock())
    cancels = [r for r in controls if isinstance(r, CancelRequest)]
    reschedules = [r for r in controls if isinstance(r, RescheduleRequest)]
    result = IngestResult(rejected=rejections)
    tally = PendingTally() if services.pending is not None else None

    # Cancels first: a message that a cancel of the same batch covers must end cancelled.
    if cancels:
        cancel(cancels, store=services.store, clock=clock, deadline=deadline)
        result.cancelled = len(cancels)

    if services.shaper is not None and delays:
        admission = services.shaper.admit(delays, clock(), deadline)
        delays = admission.admitted
        result.capped, result.deferred = admission.capped, admission.deferred
        rejections.extend(_refused(event, admission.refused))

    # Reschedules after this batch's messages are kept: one may move a message of the same
    # batch. Copies are not counted against tenant limits again.
    direct, delays = _split_direct(delays, settings, services, clock)
    keep = partial(
        _keep, result=result, tally=tally, settings=settings, services=services, clock=clock
    )
    keep(delays, deadline=deadline)
    if reschedules:
        moved = reschedule(
            reschedules, store=services.store, settings=settings, clock=clock, deadline=deadline
        )
        result.rescheduled = len(moved.copies)
        rejections.extend(_rejections_of(event, moved.refused))
        if tally is not None:
            tally.moved_away(moved.originals, (r.moved_src for r in moved.copies))
        renewed = [
            services.payloads.renew(copy, deadline)
            if _outlives_payload(base, copy, settings)
            else copy
            for base, copy in zip(moved.originals, moved.copies, strict=True)
        ]
        direct_copies, copies = _split_direct(renewed, settings, services, clock)
        direct.extend(direct_copies)
        keep(copies, deadline=deadline)
    if direct and services.direct is not None:
        done = deliver_direct(
            direct,
            store=services.store,
            direct=services.direct,
            settings=settings,
            clock=clock,
            sleep=sleep,
            deadline=deadline,
        )
        result.deliveries, result.direct_cancelled = done.deliveries, done.cancelled
        result.direct_fallback, result.errors = len(done.fallback), done.errors
        # What could not be produced here is queued like any due message (and raises, so
        # Kafka redelivers the batch, if that fails too).
        keep(done.fallback, deadline=deadline)
    if tally and services.pending is not None:
        # Last: only what was kept is counted (a failure above redelivers the batch first).
        result.pending_updates = services.pending.add(tally, deadline)
    if rejections:
        services.rejects.send(rejections, clock(), deadline)
    return result


def _outlives_payload(base: DelayRequest, copy: DelayRequest, settings: Settings) -> bool:
    """Whether a reschedule's copy is released later than the object it shares with ``base``
    is sure to live: the bucket keeps payloads the maximum delay and release spread (plus what
    a message needs after its release) from when they were written."""
    kept_s = settings.max_delay_seconds + c.MAX_RELEASE_SPREAD_SECONDS
    return bool(copy.payload_ref) and (
        copy.release_at_ms > written_no_earlier_ms(base) + kept_s * 1000
    )


def _split_direct(
    requests: list[DelayRequest], settings: Settings, services: IngestServices, clock: Clock
) -> tuple[list[DelayRequest], list[DelayRequest]]:
    """``(due within the direct window, the others)``; nothing is direct without the path.
    A reschedule's copy whose value waits in S3 is not direct either: ingest would have no
    value to produce (the emitter restores it). Nor, with ``strict_caps``, is a message its
    tenant's cap counted: the emitter gives it a new slot if its release second has passed
    (ingest behind) or late messages took it."""
    if services.direct is None or not settings.direct_window_ms:
        return [], requests
    now_ms = clock()
    limits = settings.held_caps
    direct: list[DelayRequest] = []
    others: list[DelayRequest] = []
    for r in requests:
        goes_direct = (
            is_direct(r, now_ms, settings)
            and not r.payload_ref
            and missed_slot_cap(r, limits, now_ms) is None
            # Under strict caps the emitter checks whether late messages displaced it.
            and not (r.release_rank >= 0 and limits.of(r.owner).release_per_second is not None)
        )
        if goes_direct:
            direct.append(replace(r, movable=False))  # never stored
        else:
            others.append(r)
    return direct, others


def _refused(event: Any, refused: Sequence[tuple[DelayRequest, str]]) -> list[Rejection]:
    """Rejections (``quota-exceeded``) of the records the tenant limits refused, each with
    why (the tenant and its limit)."""
    return _rejections_of(
        event, {r.src: RejectedRecord(Reason.QUOTA_EXCEEDED, detail) for r, detail in refused}
    )


def _rejections_of(event: Any, verdicts: Mapping[str, RejectedRecord]) -> list[Rejection]:
    """Rejections of the records at these coordinates, each with its original bytes."""
    return [
        rejection_of(record, verdicts[where])
        for record in iter_event_records(event)
        if (where := _coordinates(record)) in verdicts
    ]


def _coordinates(record: Any) -> str:
    try:
        return f"{record['topic']}-{record['partition']}-{record['offset']}"
    except (KeyError, TypeError):
        return ""


def _keep(
    delays: list[DelayRequest],
    *,
    result: IngestResult,
    tally: PendingTally | None,
    settings: Settings,
    services: IngestServices,
    clock: Clock,
    deadline: Deadline,
) -> None:
    """Offload large values, then queue what is due within the horizon and store the rest
    (the guard queues what a scheduler run may have missed). Raises if any is not kept."""
    if not delays:
        return
    prepared = [
        services.payloads.offload(r, deadline) if needs_offload(r, settings) else r for r in delays
    ]
    result.offloaded += sum(1 for r in prepared if r.payload_ref)

    now_ms = clock()
    to_queue: list[DelayRequest] = []
    to_store: list[DelayRequest] = []
    for request in prepared:
        routed = buckets.route(request.release_at_ms, now_ms, settings.horizon_seconds)
        if routed is buckets.Route.QUEUE:
            to_queue.append(replace(request, movable=False))
        else:
            to_store.append(request)
    # With the id index on, what goes to the delay queue is found by id too (written first: a
    # failure then leaves nothing queued without its locator).
    services.store.put_queued_locators(to_queue, deadline)
    rescued = 0
    if tally is not None:
        tally.kept(to_store, queued=False)
        tally.kept(to_queue, queued=True)
    if to_store:
        services.store.put_messages(to_store, now_ms, deadline)
        result.stored += len(to_store)
        # The guard: a scheduler run may have read (or passed) these seconds while we were
        # writing. Whatever it may have missed is queued here as well (docs/internals.md).
        mark = _watermark_after_store(services.store, now_ms, deadline)
        behind = [
            r for r in to_store if buckets.due_second(r.release_at_ms) <= mark.guarded_through
        ]
        to_queue.extend(behind)
        rescued = len(behind)
        result.rescued += rescued
    if to_queue:
        services.delay_queue.send(to_queue, clock(), deadline)
        result.queued += len(to_queue) - rescued


def _watermark_after_store(store: MessageStore, now_ms: int, deadline: Deadline) -> Watermark:
    """The scheduler's progress as it is now (strongly consistent), created if there is none
    yet: at the second before ``now``, below every due-second stored from ``now`` on (they
    are all beyond the horizon), so the scheduler's first run starts low enough."""
    mark = store.read_watermark(deadline)
    if mark is not None:
        return mark
    try:
        return store.create_watermark(buckets.due_second(now_ms) - 1, now_ms, deadline)
    except WatermarkConflictError:
        created = store.read_watermark(deadline)
        if created is None:  # pragma: no cover -- a conflict means the item exists
            raise
        return created


def cancel(
    cancels: Sequence[CancelRequest], *, store: MessageStore, clock: Clock, deadline: Deadline
) -> None:
    """Cancel pending messages by id (the layer function behind ``delay-cancel`` records).

    A cancel applies to the messages with its id written to the delay topic before it (by
    record timestamp), not to a later message that reuses the id. The emitter reads the
    markers of every batch it receives, strongly consistent: a cancel ingested before the
    emitter reads the message's batch always wins.
    """
    store.put_cancels(cancels, clock(), deadline)
