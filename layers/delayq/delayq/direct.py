"""The direct path: ingest produces messages due within ``DELAYQ_DIRECT_WINDOW_MS`` itself.

Through the delay queue, a message due now would wait for the emitter's poll and its batching
window (about a second). Ingest instead checks its cancel markers (strongly consistent, as the
emitter does), holds it to its due time on its own clock (never early), and produces it with
its own producer, exactly as the emitter would: same delivery headers, same statistics. Whatever
it cannot deliver (a cancel-marker read failed, the cluster refused or did not answer, the
deadline came first) falls back to the delay queue, where the emitter's rules apply: never lost,
at worst a duplicate with the same ``delay-id`` (a delivery report lost after the write).

The price of the hold: an invocation lasts until the last of its direct messages is due, at
most the window, and its partition waits meanwhile (see the README's Performance section).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from delayq import constants as c
from delayq.clock import Clock, Sleep
from delayq.exceptions import DelayQueueError
from delayq.kafka import KafkaDelivery
from delayq.producing import Delivery, produce_at_due, record_deliveries
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.shaping import missed_slot_cap
from delayq.stats import DeliveryStats
from delayq.store import MessageStore

__all__ = [
    "DirectResult",
    "DirectServices",
    "deliver_direct",
    "is_direct",
]


@dataclass(frozen=True)
class DirectServices:
    """What ingest needs to produce on its own: a producer and its delivery statistics."""

    delivery: KafkaDelivery
    stats: DeliveryStats = field(default_factory=DeliveryStats)


@dataclass
class DirectResult:
    """What the direct path did with its messages."""

    deliveries: list[Delivery] = field(default_factory=list)
    cancelled: int = 0
    fallback: list[DelayRequest] = field(default_factory=list)  # for the delay queue
    errors: list[str] = field(default_factory=list)


def is_direct(request: DelayRequest, now_ms: int, settings: Settings) -> bool:
    """Whether ``request`` is due within the direct window (due now or in the past included)."""
    return request.release_at_ms - now_ms <= settings.direct_window_ms


def deliver_direct(
    requests: Sequence[DelayRequest],
    *,
    store: MessageStore,
    direct: DirectServices,
    settings: Settings,
    clock: Clock,
    sleep: Sleep,
    deadline: Deadline,
) -> DirectResult:
    """Deliver ``requests`` at their due times; what cannot be delivered is in ``fallback``.
    Never raises for a delivery problem: the caller queues the fallback."""
    result = DirectResult()
    if not requests:
        return result
    try:
        flags = store.cancelled(requests, clock(), deadline)
    except DelayQueueError as e:
        result.errors.append(f"cancel markers not read: {e}; {len(requests)} message(s) queued")
        result.fallback = list(requests)
        return result
    ready = sorted(
        (r for r, cancelled in zip(requests, flags, strict=True) if not cancelled),
        key=lambda r: r.release_at_ms,
    )
    result.cancelled = len(requests) - len(ready)
    # With strict caps, a capped message whose release second ends before it is produced
    # (the cancel-marker read, the hold) is left to the emitter, which gives it a new slot.
    limits = settings.held_caps
    run = produce_at_due(
        ready,
        due_of=lambda r: r.release_at_ms,
        load=lambda index: ready[index],
        attempt_of=lambda _item, _loaded: 1,
        delivery=direct.delivery,
        clock=clock,
        sleep=sleep,
        deadline=deadline,
        reserve_seconds=settings.kafka_timeout_seconds + c.EMIT_RESERVE_SECONDS,
        missed=lambda r, now: missed_slot_cap(r, limits, now) is not None,
    )
    result.fallback.extend(run.left)
    result.fallback.extend(run.missed)
    for produced in run.produced:
        request = produced.item
        if produced.outcome is not None:
            result.errors.append(f"{request.delay_id}: {produced.outcome.failure}: queued")
            result.fallback.append(request)
            continue
        result.deliveries.append(Delivery.of(request, produced.emitted_ms, 1))
    result.errors.extend(
        record_deliveries(direct.stats, result.deliveries, store, clock(), deadline)
    )
    return result
