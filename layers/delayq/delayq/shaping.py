"""Tenant limits at ingest: release-rate caps and ingest quotas (``delayq.limits``).

**Release-rate cap.** A capped tenant's messages get release slots when they are ingested:
at most ``release_per_second`` per second, from each message's due second on, in the order
they are ingested (due order within a batch). A message whose due second is full is released
in the next second with room: ``release_ms`` is set, never before its due time. It then waits,
is queued or is stored by its release time, like any other message, so a capped burst never
floods the delay queue: it becomes visible at the rate the cap allows, and the other tenants'
messages due meanwhile do not wait behind it. The time a message waits for its slot is its
``cap delay``, counted apart from lateness (``producing.Delivery``).

**Ingest quota.** A tenant's messages accepted in one second of ingest are counted; over
``ingest_per_second``, the rest of them are rejected with reason ``quota-exceeded`` (original
bytes kept, as for every reject) or, with ``"over_quota": "defer"``, accepted and given slots
at the quota's rate from their due time on.

Both are DynamoDB counters (``rate#<tenant>#<second>``, ``quota#<tenant>#<second>``), one
atomic ``ADD`` per tenant and second touched per batch, only for tenants that have a limit. A
counter an add overshot (several batches at once) grants nothing more: the limit is never
exceeded, and a retried add only makes it stricter. Each container remembers the last second
it found full per tenant, so a long burst does not walk over its full seconds again.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from delayq import buckets
from delayq import constants as c
from delayq.contract import DelayRequest
from delayq.exceptions import ConfigurationError
from delayq.limits import TenantLimits
from delayq.retry import Deadline
from delayq.store import MessageStore

#: Adds ``n`` to the counter of ``(key, second)`` and returns the new value.
Claim = Callable[[str, int, int], int]


def release_slots(
    claim: Claim, key: str, first_second: int, count: int, per_second: int
) -> list[tuple[int, int]]:
    """Spread ``count`` messages over the seconds from ``first_second`` on, at most
    ``per_second`` in each: ``[(second, how many), ...]`` in order."""
    slots: list[tuple[int, int]] = []
    second, left = first_second, count
    while left:
        if second - first_second > c.MAX_RELEASE_SPREAD_SECONDS:
            raise ConfigurationError(
                f"the release cap of {key!r} ({per_second}/s) cannot place {count} message(s)"
                f" within {c.MAX_RELEASE_SPREAD_SECONDS} s of their due time"
            )
        after = claim(key, second, left)
        granted = max(0, min(left, per_second - (after - left)))
        if granted:
            slots.append((second, granted))
            left -= granted
        second += 1
    return slots


@dataclass
class Admission:
    """What the limits made of a batch's requests."""

    admitted: list[DelayRequest] = field(default_factory=list)
    over_quota: list[DelayRequest] = field(default_factory=list)  # to reject
    deferred: int = 0  # over quota, accepted with later release slots
    capped: int = 0  # released after their due time by a release cap


@dataclass
class Shaper:
    """Applies the tenant limits at ingest; one per container (it remembers full seconds)."""

    store: MessageStore
    limits: TenantLimits
    _full: dict[str, int] = field(default_factory=dict)

    def admit(self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline) -> Admission:
        """Count quotas, then give capped tenants their release slots. Requests of tenants
        without limits pass unchanged and cost nothing."""
        admission = Admission()
        by_tenant: dict[str, list[DelayRequest]] = {}
        for request in requests:
            by_tenant.setdefault(request.owner, []).append(request)
        for tenant, mine in by_tenant.items():
            limits = self.limits.of(tenant)
            within, over = mine, list[DelayRequest]()
            if limits.ingest_per_second is not None:
                within, over = self._quota(tenant, mine, limits.ingest_per_second, now_ms, deadline)
            if limits.release_per_second is not None:
                within = self._release(
                    f"{c.RATE_PK_PREFIX}{tenant}", within, limits.release_per_second, deadline
                )
            if over and limits.defers and limits.ingest_per_second is not None:
                key = f"{c.RATE_PK_PREFIX}{tenant}/deferred"
                within += self._release(key, over, limits.ingest_per_second, deadline)
                admission.deferred += len(over)
            elif over:
                admission.over_quota += over
            admission.admitted += within
        admission.capped = sum(1 for r in admission.admitted if r.release_ms > r.due_ms)
        return admission

    def _quota(
        self,
        tenant: str,
        requests: list[DelayRequest],
        per_second: int,
        now_ms: int,
        deadline: Deadline,
    ) -> tuple[list[DelayRequest], list[DelayRequest]]:
        second = buckets.due_second(now_ms)
        pk = f"{c.QUOTA_PK_PREFIX}{tenant}#{second}"
        after = self.store.add_to_counter(
            pk, len(requests), second + c.COUNTER_KEEP_SECONDS, deadline
        )
        room = max(0, per_second - (after - len(requests)))
        return requests[:room], requests[room:]

    def _release(
        self, key: str, requests: list[DelayRequest], per_second: int, deadline: Deadline
    ) -> list[DelayRequest]:
        """Give each request a release slot, in due order (ties: ingest order)."""

        def claim(counter: str, second: int, amount: int) -> int:
            expires = second + c.COUNTER_KEEP_SECONDS
            return self.store.add_to_counter(f"{counter}#{second}", amount, expires, deadline)

        out: list[DelayRequest] = []
        ordered = sorted(requests, key=lambda r: r.due_ms)
        for second, same in itertools.groupby(ordered, key=lambda r: buckets.due_second(r.due_ms)):
            group = list(same)
            # Seconds this container already found full are not claimed again.
            start = max(second, self._full.get(key, second - 1) + 1)
            for slot, count in release_slots(claim, key, start, len(group), per_second):
                out.extend(_released(r, slot) for r in group[:count])
                group = group[count:]
                self._full[key] = max(self._full.get(key, slot - 1), slot - 1)
        return out


def _released(request: DelayRequest, slot_second: int) -> DelayRequest:
    """``request`` released in ``slot_second``: at its due time if that falls there."""
    release = max(request.due_ms, slot_second * 1000)
    if release == request.due_ms:
        return request
    return dataclasses.replace(request, release_ms=release)
