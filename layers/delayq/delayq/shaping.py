"""Tenant limits at ingest: release-rate caps and ingest quotas (``delayq.limits``).

**Release-rate cap.** A capped tenant's messages get release slots when they are ingested:
at most ``release_per_second`` per second, from each message's due second on, in the order
they are ingested (due order within a batch). A message whose due second is full is released
in the next second with room: ``release_ms`` is set, never before its due time. It then waits,
is queued or is stored by its release time, like any other message, so a capped burst never
floods the delay queue: it becomes visible at the rate the cap allows, and the other tenants'
messages due meanwhile do not wait behind it. The time a message waits for its slot is its
``cap delay``, counted apart from lateness (``producing.Delivery``).

**Ingest quota.** A tenant's messages written in one second (their records' timestamps, so
that a redelivered batch is counted in the same seconds) are counted; over
``ingest_per_second``, the rest of them are rejected with reason ``quota-exceeded`` (original
bytes kept, as for every reject) or, with ``"over_quota": "defer"``, accepted and given slots
at the quota's rate from their due time on (from the release cap's counters, at most the cap,
when the tenant also has one).

Both are DynamoDB counters (``rate#<tenant>#<second>``, ``quota#<tenant>#<second>``), one
atomic ``ADD`` per tenant and second touched per batch, only for tenants that have a limit. A
counter an add overshot (several batches at once) grants nothing more: the limit is never
exceeded. The quota counts the seconds of the records' own timestamps (the delay topic's
clock), not ingest's clock.

**Replays.** Every add is a claim (:meth:`MessageStore.claim_counter`) of a span of one
source partition's records (offsets ``first..last``), named after the partition, the first
offset, the counter and the second; the add keeps the counter's value before it and the
span's last offset under that name. Each record's *rank* is the counter's value before it
(the claim's value before, plus its place in the span), and a record passes a limit when its
rank is under it. A claim made again (a lost response retried, a redelivered batch) adds
nothing and answers as the first time did; a redelivered batch holding more records than the
first attempt (Kafka retries from the batch's first offset with the records there by then)
finds the first attempt's span, ranks those records as it did, and claims the rest as a span
of its own. Decisions depend only on the records and on those answers (no container memory),
so every record of a redelivered batch is admitted, refused and deferred as in its first
attempt, and gets the same release slot: a message is stored once, and a record kept is never
also rejected. (A batch that starts inside a span an earlier attempt claimed, which the event
source does not do, counts its records again: stricter, never over a limit. Records without
source coordinates are claimed as one group named after them.)

**While the pipeline catches up** (after a target outage, behind a backlog), a capped
tenant's messages whose release second has passed would all go out at once. With
``strict_caps`` on, the emitter (ingest's direct path leaves capped messages to it) gives each
of them a new slot, late messages first: they count apart (``l``) in the seconds from the
emitter's hold ahead on, and an on-time message whose rank in its second (given at ingest) is
past what they left is displaced to a later slot (:meth:`Shaper.catch_up`). No second of the
emitter's clock gets more than the cap; on-time messages of uncapped tenants make no call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from delayq import buckets
from delayq import constants as c
from delayq.exceptions import DelayQueueError
from delayq.limits import TenantLimits
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import MessageStore

__all__ = [
    "Admission",
    "CatchUp",
    "Claim",
    "NoReleaseSlotError",
    "Shaper",
    "catch_up_lead_ms",
    "missed_slot_cap",
    "release_slots",
]

#: Claims the records at ``positions`` (of a group a claim was made for) on the counter of
#: ``(key, second)``: their ranks there (the counter's value before each), in that order.
Claim = Callable[[str, int, Sequence[int]], list[int]]


class NoReleaseSlotError(Exception):
    """A release cap cannot place messages within ``MAX_RELEASE_SPREAD_SECONDS`` of their due
    time: the cap is too low for the traffic (the messages are rejected, never dropped).
    ``last_full`` is the last second the probe found full."""

    def __init__(self, message: str, last_full: int) -> None:
        super().__init__(message)
        self.last_full = last_full


def release_slots(
    claim: Claim,
    key: str,
    due_second: int,
    count: int,
    per_second: int,
    *,
    first_second: int | None = None,
    spread: int | None = None,
) -> dict[int, tuple[int, int]]:
    """Spread ``count`` messages (positions ``0..count-1`` of the group ``claim`` counts) due
    in ``due_second`` over the seconds from ``first_second`` (default: their due second) on:
    a message goes in the first second where its rank is under ``per_second``.
    ``{position: (second, rank)}``.

    Past full seconds the probe gallops (1, 2, 4 ... up to ``RELEASE_PROBE_MAX_STEP``
    seconds at a time), so that a container that has not seen a long burst's full seconds
    finds the first with room in a few hundred claims rather than one per second; a second
    it skips keeps its room for others, so releases come at most that much later, never
    earlier and never over the cap (each rank is one place in the counter). No slot more
    than ``spread`` seconds (default ``MAX_RELEASE_SPREAD_SECONDS``) after the due second is
    taken: :class:`NoReleaseSlotError` then."""
    spread = c.MAX_RELEASE_SPREAD_SECONDS if spread is None else spread
    slots: dict[int, tuple[int, int]] = {}
    second = due_second if first_second is None else max(due_second, first_second)
    left, step, last_full = list(range(count)), 1, second - 1
    while left:
        if second - due_second > spread:
            raise NoReleaseSlotError(
                f"the release cap of {key.removeprefix(c.RATE_PK_PREFIX)!r} ({per_second}/s)"
                f" cannot place it within {spread} s of its due time",
                last_full,
            )
        granted = {
            position: (second, rank)
            for position, rank in zip(left, claim(key, second, left), strict=True)
            if rank < per_second
        }
        if granted:
            slots.update(granted)
            left = [position for position in left if position not in granted]
            second, step = second + 1, 1
        else:
            last_full = second
            second, step = second + step, min(step * 2, c.RELEASE_PROBE_MAX_STEP)
    return slots


@dataclass
class Admission:
    """What the limits made of a batch's requests."""

    admitted: list[DelayRequest] = field(default_factory=list)
    # To reject (reason quota-exceeded), each with why: over the ingest quota, or no release
    # slot within MAX_RELEASE_SPREAD_SECONDS.
    refused: list[tuple[DelayRequest, str]] = field(default_factory=list)
    deferred: int = 0  # over quota, accepted with later release slots
    capped: int = 0  # released after their due time by a release cap


def catch_up_lead_ms(settings: Settings) -> int:
    """How far ahead the emitter's catch-up claims (``Shaper.claim_lead_ms``): the hold, a
    margin for clocks and the claim's latency."""
    return settings.max_hold_ms + c.RESCHEDULE_MARGIN_MS


def missed_slot_cap(request: DelayRequest, limits: TenantLimits, now_ms: int) -> int | None:
    """The release cap of ``request``'s tenant when its release second has passed (produced
    now, it would land in a second whose counter did not count it); None when it is on time
    or its tenant has no cap."""
    if buckets.due_second(request.release_at_ms) >= buckets.due_second(now_ms):
        return None
    return limits.of(request.owner).release_per_second


@dataclass
class CatchUp:
    """New release slots for late capped messages (:meth:`Shaper.catch_up`), by their index
    in the requests given: the start of the second each may go in, or why none was taken."""

    slots: dict[int, int] = field(default_factory=dict)
    unplaced: dict[int, str] = field(default_factory=dict)
    # Of the unplaced: those whose cap had no room (the others' counter could not be reached).
    full: set[int] = field(default_factory=set)
    # Those whose claim was answered too late to use (they claim again at once).
    again: set[int] = field(default_factory=set)


@dataclass
class Shaper:
    """Applies the tenant limits; one per container (the emitter's catch-up remembers the
    seconds it found full; admission remembers nothing, so that a replay decides the same)."""

    store: MessageStore
    limits: TenantLimits
    # How far ahead a catch-up claims (the emitter's hold + a margin for clocks and the
    # claim's latency): the on-time messages of a second check its late count when they are
    # received, at most the hold before it, so they see every claim on it.
    claim_lead_ms: int = c.DEFAULT_MAX_HOLD_MS + c.RESCHEDULE_MARGIN_MS
    _full: dict[str, int] = field(default_factory=dict)

    def admit(self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline) -> Admission:
        """Count quotas, then give capped tenants their release slots. Requests of tenants
        without limits pass unchanged and cost nothing. The same requests admitted again
        (a redelivered batch) get the same decisions and slots; ``now_ms`` is not used for
        them (the quota counts the records' timestamps)."""
        admission = Admission()
        by_tenant: dict[str, list[DelayRequest]] = {}
        for request in sorted(requests, key=record_order):
            by_tenant.setdefault(request.owner, []).append(request)
        for tenant, mine in by_tenant.items():
            limits = self.limits.of(tenant)
            within, over = mine, list[DelayRequest]()
            if limits.ingest_per_second is not None:
                within, over = self._quota(tenant, mine, limits.ingest_per_second, deadline)
            if limits.release_per_second is not None:
                within = self._release(
                    f"{c.RATE_PK_PREFIX}{tenant}",
                    within,
                    limits.release_per_second,
                    deadline,
                    admission,
                )
            if over and limits.defers and limits.ingest_per_second is not None:
                key, rate = f"{c.RATE_PK_PREFIX}{tenant}/deferred", limits.ingest_per_second
                if limits.release_per_second is not None:
                    # Deferred messages are the tenant's too: they take slots of its cap (never
                    # over it), at the lower of the two rates.
                    key, rate = f"{c.RATE_PK_PREFIX}{tenant}", min(rate, limits.release_per_second)
                within += self._release(key, over, rate, deadline, admission, purpose="deferred")
                admission.deferred += len(over)
            elif over:
                detail = (
                    f"tenant {tenant!r} is over its ingest quota of "
                    f"{limits.ingest_per_second} messages/s"
                )
                admission.refused += [(r, detail) for r in over]
            admission.admitted += within
        admission.capped = sum(1 for r in admission.admitted if r.release_ms > r.due_ms)
        return admission

    def _quota(
        self,
        tenant: str,
        requests: list[DelayRequest],
        per_second: int,
        deadline: Deadline,
    ) -> tuple[list[DelayRequest], list[DelayRequest]]:
        """``(within, over)`` the quota, counted per second of the records' timestamps, in
        record order."""
        within: list[DelayRequest] = []
        over: list[DelayRequest] = []
        for second, same in itertools.groupby(requests, key=lambda r: r.ts_ms // 1000):
            group = list(same)
            claim = self._claim_spans(deadline, "quota", group)
            ranks = claim(f"{c.QUOTA_PK_PREFIX}{tenant}", second, range(len(group)))
            for request, rank in zip(group, ranks, strict=True):
                (within if rank < per_second else over).append(request)
        return within, over

    def _release(
        self,
        key: str,
        requests: list[DelayRequest],
        per_second: int,
        deadline: Deadline,
        admission: Admission,
        *,
        purpose: str = "release",
    ) -> list[DelayRequest]:
        """Give each request a release slot, in due order (ties: record order); those that
        get none are refused in ``admission``. The probe starts at each group's due second
        (no container memory), so a replay makes the same claims."""
        out: list[DelayRequest] = []
        ordered = sorted(requests, key=lambda r: (r.due_ms, record_order(r)))
        for second, same in itertools.groupby(ordered, key=lambda r: buckets.due_second(r.due_ms)):
            group = list(same)
            claim = self._claim_spans(deadline, purpose, group)
            try:
                slots = release_slots(claim, key, second, len(group), per_second)
            except NoReleaseSlotError as e:
                admission.refused += [(r, str(e)) for r in group]
                continue
            out.extend(_released(r, *slots[n]) for n, r in enumerate(group))
        return out

    def catch_up(
        self,
        requests: Sequence[DelayRequest],
        now_ms: int,
        deadline: Deadline,
        clock: Callable[[], int] | None = None,
    ) -> CatchUp:
        """New slots for the capped tenants' messages that cannot go in their release second:
        those whose second has passed (:func:`missed_slot_cap`), and those on time that the
        late messages before them displaced (:meth:`displaced`); the others are left out.

        Late messages go first: per tenant, in release order (ties: the order given), they
        claim the cap's seconds from ``claim_lead_ms`` ahead on a count of their own (``l``
        on the counters ingest fills); an on-time message whose rank in its second is past
        what the late ones left is displaced in turn, so no second gets more than the cap and
        the tenant's messages go out oldest first. A claim answered after its second's
        deadline (on ``clock``, default: ``now_ms``) is not used (it only wastes that
        room). A tenant whose counter cannot be
        reached (throttled, the network), or whose seconds are taken for
        ``CATCH_UP_SPREAD_SECONDS`` ahead, is left in ``unplaced`` with why."""
        out = CatchUp()
        late: dict[tuple[str, int], list[int]] = {}
        try:
            displaced = self.displaced(requests, now_ms, deadline)
        except DelayQueueError as e:
            # The late counts cannot be read: the on-time messages wait (fail closed).
            ranked = self._ranked(requests, now_ms)
            out.unplaced.update((i, f"late counts not read: {e}") for i in ranked)
            displaced = set()
        for index, request in enumerate(requests):
            cap = missed_slot_cap(request, self.limits, now_ms)
            if cap is None and index in displaced:
                cap = self.limits.of(request.owner).release_per_second
            if cap is not None:
                late.setdefault((request.owner, cap), []).append(index)
        first = buckets.due_second(now_ms + self.claim_lead_ms) + 1
        for (tenant, per_second), indexes in late.items():
            key = f"{c.RATE_PK_PREFIX}{tenant}"
            indexes.sort(key=lambda i: requests[i].release_at_ms)
            tag = _tag(f"catch-up#{first}", (requests[i] for i in indexes))
            claim = self._claim(deadline, tag, counter=c.ATTR_LATE_COUNT)
            start = max(first, self._full.get(key, first - 1) + 1)
            try:
                slots = release_slots(
                    claim,
                    key,
                    first,
                    len(indexes),
                    per_second,
                    first_second=start,
                    spread=c.CATCH_UP_SPREAD_SECONDS,
                )
            except NoReleaseSlotError as e:
                self._full[key] = max(self._full.get(key, e.last_full), e.last_full)
                out.unplaced.update((i, str(e)) for i in indexes)
                out.full.update(indexes)
                continue
            except DelayQueueError as e:
                out.unplaced.update((i, str(e)) for i in indexes)
                continue
            answered_ms = clock() if clock is not None else now_ms
            for position, (second, _) in slots.items():
                index = indexes[position]
                if answered_ms + self.claim_lead_ms < second * 1000:
                    out.slots[index] = second * 1000
                else:
                    out.again.add(index)
                self._full[key] = max(self._full.get(key, second - 1), second - 1)
        return out

    def displaced(
        self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline
    ) -> set[int]:
        """The on-time capped messages (by index) whose rank in their release second is past
        what the late messages that claimed it first left: they wait for a later slot. One
        strongly consistent read per tenant and second (none without ranked messages)."""
        ranked = self._ranked(requests, now_ms)
        if not ranked:
            return set()
        keys = {i: self._counter_key(requests[i]) for i in ranked}
        counts = self.store.late_counts(list(keys.values()), deadline)
        return {
            i
            for i in ranked
            if requests[i].release_rank
            >= (self.limits.of(requests[i].owner).release_per_second or 0) - counts[keys[i]]
        }

    def _ranked(self, requests: Sequence[DelayRequest], now_ms: int) -> list[int]:
        """The on-time messages a cap counted in their release second (a rank, a cap)."""
        return [
            i
            for i, r in enumerate(requests)
            if r.release_rank >= 0
            and self.limits.of(r.owner).release_per_second is not None
            and missed_slot_cap(r, self.limits, now_ms) is None
        ]

    @staticmethod
    def _counter_key(request: DelayRequest) -> str:
        second = buckets.due_second(request.release_at_ms)
        return f"{c.RATE_PK_PREFIX}{request.owner}#{second}"

    def _claim(self, deadline: Deadline, tag: str, *, counter: str = "n") -> Claim:
        """Claims on the store's counters (``<key>#<second>``, kept a day after it), each
        made once per ``tag`` (the records it counts), counter and amount; ``counter``: the
        attribute counted (``n``, or the late count)."""

        def claim(key: str, second: int, positions: Sequence[int]) -> list[int]:
            counted = key if counter == "n" else f"{key}/{counter}"
            name = _claim_name(f"{tag}|{counted}|{second}|{len(positions)}")
            before, _ = self.store.claim_counter(
                f"{key}#{second}", len(positions), name, _expiry(second), deadline, counter=counter
            )
            return list(range(before, before + len(positions)))

        return claim

    def _claim_spans(
        self, deadline: Deadline, purpose: str, group: Sequence[DelayRequest]
    ) -> Claim:
        """Claims of ``group``'s records (on the ``n`` count) by spans of source offsets, one
        partition at a time (see the module's docstring, Replays): a record's rank is the same
        in every batch that holds it."""

        def claim(key: str, second: int, positions: Sequence[int]) -> list[int]:
            ranks: dict[int, int] = {}
            runs: dict[str, list[tuple[int, int]]] = {}
            loose: list[int] = []
            for position in positions:
                head, offset = source_of(group[position])
                if offset < 0:
                    loose.append(position)
                else:
                    runs.setdefault(head, []).append((offset, position))
            for head, run in runs.items():
                rest = sorted(run)
                while rest:
                    name = _claim_name(f"{purpose}|{head}|{rest[0][0]}|{key}|{second}")
                    before, last = self.store.claim_counter(
                        f"{key}#{second}",
                        len(rest),
                        name,
                        _expiry(second),
                        deadline,
                        span_end=rest[-1][0],
                    )
                    # A claim of this span made before covers its records up to ``last``;
                    # they are ranked in the group's order (due order, for release slots).
                    covered = sorted(p for offset, p in rest if offset <= last) or [rest[0][1]]
                    ranks.update((p, before + n) for n, p in enumerate(covered))
                    rest = rest[len(covered) :]
            if loose:
                tag = _tag(purpose, (group[p] for p in loose))
                ranks.update(
                    zip(loose, self._claim(deadline, tag)(key, second, loose), strict=True)
                )
            return [ranks[p] for p in positions]

        return claim


def _expiry(second: int) -> int:
    """When a counter item of ``second`` may go (kept a day after it)."""
    return second + c.COUNTER_KEEP_SECONDS


def source_of(request: DelayRequest) -> tuple[str, int]:
    """``(topic-partition, offset)`` of the record a request came from; offset -1 for one
    without source coordinates (a reschedule's copy)."""
    head, _, offset = request.src.rpartition("-")
    if head and offset.isdigit():
        return head, int(offset)
    return request.src, -1


def record_order(request: DelayRequest) -> tuple[int, str, int, str]:
    """The records' own order (invariant 12): timestamp, then partition and offset (then id,
    for a reschedule's copies and records without coordinates)."""
    return request.ts_ms, *source_of(request), request.delay_id


def _tag(purpose: str, requests: Iterable[DelayRequest]) -> str:
    """A digest naming what a group of claims counts: the purpose and the records."""
    digest = hashlib.blake2b(purpose.encode(), digest_size=16)
    for r in requests:
        digest.update(b"\0" + r.src.encode() + b"\0" + r.delay_id.encode())
    return digest.hexdigest()


def _claim_name(what: str) -> str:
    """The attribute that records one claim on a counter item (17 bytes)."""
    return "c" + hashlib.blake2b(what.encode(), digest_size=8).hexdigest()


def _released(request: DelayRequest, slot_second: int, rank: int) -> DelayRequest:
    """``request`` released in ``slot_second`` (at its due time if that falls there), the
    ``rank``-th its cap counted there."""
    release = max(request.due_ms, slot_second * 1000)
    return dataclasses.replace(
        request, release_ms=release if release != request.due_ms else 0, release_rank=rank
    )
