"""Producing delay messages at their due time, never before: the loop the emitter and ingest's
direct path share.

Items are produced in the order given (the caller sorts them by due time), each once its due
time is reached on the caller's clock; then every delivery report is awaited. Production stops
while there is still ``reserve_seconds`` left before the deadline for the flush and for putting
back what was not produced, so a batch never runs into its function's timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

from delayq.clock import Clock, Sleep
from delayq.exceptions import DelayQueueError
from delayq.kafka import NO_REPORT, KafkaDelivery, OutRecord, Undelivered
from delayq.records import DelayRequest, delivery_headers
from delayq.retry import Deadline
from delayq.stats import DeliveryStats
from delayq.store import MessageStore

__all__ = [
    "Delivery",
    "ProduceRun",
    "Produced",
    "produce_at_due",
    "record_deliveries",
    "wait_until",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Delivery:
    """One acknowledged emission (for lateness statistics and the delivery log)."""

    target: str
    due_ms: int
    emitted_ms: int
    delay_id: str = ""
    attempt: int = 1
    # When its tenant's release-rate cap let it go (0: at its due time).
    release_ms: int = 0
    tenant: str = ""

    @classmethod
    def of(cls, request: DelayRequest, emitted_ms: int, attempt: int) -> Delivery:
        """The delivery of ``request`` at ``emitted_ms``."""
        return cls(
            request.target,
            request.due_ms,
            emitted_ms,
            request.delay_id,
            attempt,
            request.release_ms,
            request.owner,
        )

    @property
    def lateness_ms(self) -> int:
        """Emit time minus the time it was free to go (its due time, or its release slot):
        the pipeline's own lateness, never negative unless something is broken."""
        return self.emitted_ms - max(self.due_ms, self.release_ms)

    @property
    def cap_delay_ms(self) -> int:
        """How long its tenant's release-rate cap held it after due (counted apart from
        :attr:`lateness_ms`, so that it never reads as a fault)."""
        return max(0, self.release_ms - self.due_ms)


@dataclass(frozen=True)
class Produced(Generic[T]):
    """One item that was produced, when, and its delivery report (None: acknowledged)."""

    item: T
    emitted_ms: int
    attempt: int
    outcome: Undelivered | None


@dataclass
class ProduceRun(Generic[T]):
    """What became of the items: produced (with their reports), not loadable, left over
    because the deadline came first, or not produced because ``missed`` said they could no
    longer go when their time came."""

    produced: list[Produced[T]] = field(default_factory=list)
    unloaded: list[tuple[T, Undelivered]] = field(default_factory=list)
    left: list[T] = field(default_factory=list)
    missed: list[T] = field(default_factory=list)


def produce_at_due(
    items: Sequence[T],
    *,
    due_of: Callable[[T], int],
    load: Callable[[int], DelayRequest | Undelivered],
    attempt_of: Callable[[T, DelayRequest], int],
    delivery: KafkaDelivery,
    clock: Clock,
    sleep: Sleep,
    deadline: Deadline,
    reserve_seconds: float,
    missed: Callable[[DelayRequest, int], bool] | None = None,
) -> ProduceRun[T]:
    """Produce each item at its due time. ``load(i)`` gives item ``i`` ready to produce (its
    value in memory) or why it cannot be; it is called just before the item is produced, so a
    caller can fetch values lazily. ``missed(request, now)``, asked at the moment it would be
    produced, keeps back an item that may no longer go then (a capped message whose release
    second has passed: that second's counter counted it, the current one did not)."""
    run: ProduceRun[T] = ProduceRun()
    outcomes: list[Undelivered | None] = []
    pending: list[tuple[T, int, int]] = []
    for index, item in enumerate(items):
        wait_seconds = max(0, due_of(item) - clock()) / 1000
        if deadline.remaining_seconds() - wait_seconds < reserve_seconds:
            run.left.extend(items[index:])
            break
        loaded = load(index)
        if isinstance(loaded, Undelivered):
            run.unloaded.append((item, loaded))
            continue
        now = wait_until(loaded.release_at_ms, clock, sleep)
        if missed is not None and missed(loaded, now):
            run.missed.append(item)
            continue
        attempt = attempt_of(item, loaded)
        record = OutRecord(
            loaded.target, loaded.key, loaded.value, delivery_headers(loaded, now, attempt)
        )
        outcomes.append(NO_REPORT)
        pending.append((item, now, attempt))
        delivery.produce(record, partial(outcomes.__setitem__, len(outcomes) - 1))
    if pending:
        delivery.flush()
    run.produced = [
        Produced(item, emitted, attempt, outcome)
        for (item, emitted, attempt), outcome in zip(pending, outcomes, strict=True)
    ]
    return run


def wait_until(due_ms: int, clock: Clock, sleep: Sleep) -> int:
    """Sleep until ``due_ms`` on ``clock``; returns the time reached (never before due)."""
    while (now := clock()) < due_ms:
        sleep(max(due_ms - now, 1) / 1000)
    return now


def record_deliveries(
    stats: DeliveryStats,
    deliveries: Sequence[Delivery],
    store: MessageStore,
    now_ms: int,
    deadline: Deadline,
) -> list[str]:
    """Count deliveries into the container's statistics and write what the flush policy says
    is due (about one item per container-minute). A failed write loses statistics, never
    messages: it is returned as an error line, not raised."""
    for d in deliveries:
        stats.add(d.target, max(d.due_ms, d.release_ms), d.emitted_ms)
    errors = []
    for item in stats.flush(now_ms):
        try:
            store.put_item(item, deadline)
        except DelayQueueError as e:
            errors.append(f"statistics not written: {e}")
    return errors
