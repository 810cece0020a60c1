"""Tenant limits at ingest (delayq.shaping): release slots never before due and never over the
cap, quotas that reject or defer, and tenants without limits untouched and free."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from delayq import buckets
from delayq import constants as c
from delayq.limits import parse_limits
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.shaping import NoReleaseSlotError, Shaper, release_slots
from delayq.store import MessageStore
from testkit.clock import NOW_MS
from tests.factories import AwsResources, ClientProxy, delay_request, store_of

DUE_S = NOW_MS // 1000 + 600


class DictCounters:
    """The counters of ``release_slots`` in memory."""

    def __init__(self) -> None:
        self.values: Counter[tuple[str, int]] = Counter()
        self.claims = 0

    def __call__(self, key: str, second: int, amount: int) -> int:
        self.claims += 1
        self.values[key, second] += amount
        return self.values[key, second]


def test_slots_fill_each_second_up_to_the_cap() -> None:
    assert release_slots(DictCounters(), "rate#a", 100, 7, 3) == [(100, 3), (101, 3), (102, 1)]


def test_slots_take_only_the_room_left_in_a_second() -> None:
    counters = DictCounters()
    counters.values["rate#a", 100] = 2
    assert release_slots(counters, "rate#a", 100, 4, 3) == [(100, 1), (101, 3)]


def test_an_overshot_counter_grants_nothing_more() -> None:
    # Concurrent batches each added their whole count: the second is over its cap.
    counters = DictCounters()
    counters.values["rate#a", 100] = 9
    assert release_slots(counters, "rate#a", 100, 2, 3) == [(101, 2)]


def test_a_cap_too_low_for_the_traffic_says_so() -> None:
    def always_full(_key: str, _second: int, amount: int) -> int:
        return 10**9 + amount

    with pytest.raises(NoReleaseSlotError, match=r"release cap of 'a' \(1/s\) cannot place"):
        release_slots(always_full, "rate#a", 100, 1, 1)


def test_past_full_seconds_the_probe_gallops_and_never_exceeds_the_cap() -> None:
    counters = DictCounters()
    for second in range(100, 1100):  # a long burst another container placed
        counters.values["rate#a", second] = 3
    slots = release_slots(counters, "rate#a", 100, 5, 3)
    assert counters.claims < 40  # not one claim per full second
    assert sum(n for _, n in slots) == 5
    assert all(second >= 1100 for second, _ in slots)
    assert all(n <= 3 for _, n in slots)
    # Once a second has room, the next ones are taken in order again.
    (first, _), (second, _) = slots
    assert second == first + 1


@pytest.fixture
def store(aws: AwsResources) -> MessageStore:
    return counted_store(aws)[0]


def counted_store(aws: AwsResources) -> tuple[MessageStore, ClientProxy]:
    proxy = ClientProxy(aws.dynamodb, update_item=aws.dynamodb.update_item)
    return store_of(proxy, aws.settings), proxy


def burst(
    tenant: str, count: int, due_ms: int = DUE_S * 1000 + 250, **kw: Any
) -> list[DelayRequest]:
    return [
        dataclasses.replace(
            delay_request(delay_id=f"{tenant}-{i}", due_ms=due_ms), tenant=tenant, **kw
        )
        for i in range(count)
    ]


def per_second(requests: list[DelayRequest]) -> Counter[int]:
    return Counter(buckets.due_second(r.release_at_ms) for r in requests)


def test_tenants_without_limits_pass_unchanged_and_cost_no_request(aws: AwsResources) -> None:
    store, proxy = counted_store(aws)
    shaper = Shaper(store, parse_limits('{"capped": {"release_per_second": 1}}'))
    requests = burst("free", 50)
    admission = shaper.admit(requests, NOW_MS, Deadline.after(30))
    assert admission.admitted == requests
    assert (admission.capped, admission.deferred, admission.refused) == (0, 0, [])
    assert proxy.calls == []


def test_a_capped_burst_goes_out_at_the_cap_from_its_due_time_never_before(
    store: MessageStore,
) -> None:
    shaper = Shaper(store, parse_limits('{"bulk": {"release_per_second": 10}}'))
    requests = burst("bulk", 25)
    admission = shaper.admit(requests, NOW_MS, Deadline.after(30))
    assert per_second(admission.admitted) == {DUE_S: 10, DUE_S + 1: 10, DUE_S + 2: 5}
    assert all(r.release_at_ms >= r.due_ms for r in admission.admitted)
    # Those released at due keep no release time; the others are released at their second.
    assert sum(1 for r in admission.admitted if r.release_ms == 0) == 10
    assert {r.release_ms for r in admission.admitted if r.release_ms} == {
        (DUE_S + 1) * 1000,
        (DUE_S + 2) * 1000,
    }
    assert admission.capped == 15
    assert {r.delay_id for r in admission.admitted} == {r.delay_id for r in requests}


def test_slots_follow_due_order(store: MessageStore) -> None:
    shaper = Shaper(store, parse_limits('{"bulk": {"release_per_second": 2}}'))
    late = burst("bulk", 2, due_ms=DUE_S * 1000 + 900)
    early = [dataclasses.replace(r, delay_id=f"e-{i}") for i, r in enumerate(burst("bulk", 3))]
    admission = shaper.admit(late + early, NOW_MS, Deadline.after(30))
    released = {r.delay_id: r.release_at_ms for r in admission.admitted}
    assert max(released[r.delay_id] for r in early) <= min(released[r.delay_id] for r in late)


def test_containers_sharing_a_cap_never_exceed_it(aws: AwsResources) -> None:
    limits = parse_limits('{"bulk": {"release_per_second": 7}}')
    containers = [Shaper(counted_store(aws)[0], limits) for _ in range(3)]
    admitted: list[DelayRequest] = []
    for round_ in range(4):
        for n, shaper in enumerate(containers):
            batch = [
                dataclasses.replace(r, delay_id=f"{round_}-{n}-{r.delay_id}")
                for r in burst("bulk", 5)
            ]
            admitted += shaper.admit(batch, NOW_MS, Deadline.after(30)).admitted
    assert len(admitted) == 60
    assert max(per_second(admitted).values()) <= 7
    assert min(per_second(admitted)) == DUE_S


def test_a_container_does_not_claim_seconds_it_found_full_again(aws: AwsResources) -> None:
    store, proxy = counted_store(aws)
    shaper = Shaper(store, parse_limits('{"bulk": {"release_per_second": 5}}'))
    shaper.admit(burst("bulk", 50), NOW_MS, Deadline.after(30))
    first = len(proxy.calls)
    assert first == 10  # one claim per second filled
    shaper.admit(
        [dataclasses.replace(r, delay_id=f"b-{r.delay_id}") for r in burst("bulk", 5)],
        NOW_MS,
        Deadline.after(30),
    )
    assert len(proxy.calls) - first == 2  # the last partly filled second, then the next


def test_over_its_quota_a_tenant_is_rejected_and_the_next_second_admits_again(
    store: MessageStore,
) -> None:
    shaper = Shaper(store, parse_limits('{"noisy": {"ingest_per_second": 5}}'))
    first = shaper.admit(burst("noisy", 8), NOW_MS, Deadline.after(30))
    assert [r.delay_id for r in first.admitted] == [f"noisy-{i}" for i in range(5)]
    assert [r.delay_id for r, _ in first.refused] == [f"noisy-{i}" for i in range(5, 8)]
    assert {why for _, why in first.refused} == {
        "tenant 'noisy' is over its ingest quota of 5 messages/s"
    }
    assert first.deferred == 0
    same_second = shaper.admit(burst("noisy", 2), NOW_MS + 999 - NOW_MS % 1000, Deadline.after(30))
    assert (len(same_second.admitted), len(same_second.refused)) == (0, 2)
    next_second = shaper.admit(burst("noisy", 2), NOW_MS + 1000, Deadline.after(30))
    assert (len(next_second.admitted), len(next_second.refused)) == (2, 0)


def test_over_its_quota_a_deferring_tenant_is_released_at_the_quota_rate(
    store: MessageStore,
) -> None:
    shaper = Shaper(
        store, parse_limits('{"noisy": {"ingest_per_second": 4, "over_quota": "defer"}}')
    )
    admission = shaper.admit(burst("noisy", 12), NOW_MS, Deadline.after(30))
    assert admission.refused == []
    assert admission.deferred == 8
    assert len(admission.admitted) == 12
    assert all(r.release_at_ms >= r.due_ms for r in admission.admitted)
    # Within the quota: at due. Deferred: 4 per second from due on (their own counter).
    released = {r.delay_id: buckets.due_second(r.release_at_ms) for r in admission.admitted}
    assert [released[f"noisy-{i}"] for i in range(12)] == [DUE_S] * 8 + [DUE_S + 1] * 4


def test_messages_a_cap_cannot_place_are_refused_and_the_rest_admitted(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(c, "MAX_RELEASE_SPREAD_SECONDS", 2)
    shaper = Shaper(store, parse_limits('{"bulk": {"release_per_second": 2}}'))
    requests = burst("bulk", 4) + burst("other", 2)
    admission = shaper.admit(requests, NOW_MS, Deadline.after(30))
    # Seconds due, +1, +2 hold 6; the other tenant has no limit.
    assert len(admission.admitted) == 6
    assert admission.refused == []
    late = [dataclasses.replace(r, delay_id=f"late-{r.delay_id}") for r in burst("bulk", 3)]
    refused = shaper.admit(late, NOW_MS, Deadline.after(30)).refused
    assert [r.delay_id for r, _ in refused] == ["late-bulk-0", "late-bulk-1", "late-bulk-2"]
    assert "release cap of 'bulk' (2/s) cannot place it within 2 s" in refused[0][1]
