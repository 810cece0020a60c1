"""Tenant limits at ingest (delayq.shaping): release slots never before due and never over the
cap, quotas that reject or defer, and tenants without limits untouched and free."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from delayq import buckets
from delayq import constants as c
from delayq.limits import parse_limits
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.shaping import NoReleaseSlotError, Shaper, missed_slot_cap, release_slots
from delayq.store import MessageStore
from testkit.clock import NOW_MS
from tests.factories import AwsResources, ClientProxy, client_error, delay_request, store_of

DUE_S = NOW_MS // 1000 + 600


class DictCounters:
    """The counters of ``release_slots`` in memory."""

    def __init__(self) -> None:
        self.values: Counter[tuple[str, int]] = Counter()
        self.claims = 0

    def __call__(self, key: str, second: int, positions: Sequence[int]) -> list[int]:
        self.claims += 1
        before = self.values[key, second]
        self.values[key, second] += len(positions)
        return list(range(before, before + len(positions)))


def summary(slots: dict[int, tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``[(second, how many, the lowest rank there), ...]`` in order of seconds."""
    seconds: dict[int, list[int]] = {}
    for second, rank in slots.values():
        seconds.setdefault(second, []).append(rank)
    return [(second, len(ranks), min(ranks)) for second, ranks in sorted(seconds.items())]


def test_slots_fill_each_second_up_to_the_cap() -> None:
    assert summary(release_slots(DictCounters(), "rate#a", 100, 7, 3)) == [
        (100, 3, 0),
        (101, 3, 0),
        (102, 1, 0),
    ]


def test_slots_take_only_the_room_left_in_a_second() -> None:
    counters = DictCounters()
    counters.values["rate#a", 100] = 2
    # The first gets rank 2 in its second (two were counted there before it).
    assert summary(release_slots(counters, "rate#a", 100, 4, 3)) == [(100, 1, 2), (101, 3, 0)]


def test_an_overshot_counter_grants_nothing_more() -> None:
    # Concurrent batches each added their whole count: the second is over its cap.
    counters = DictCounters()
    counters.values["rate#a", 100] = 9
    assert summary(release_slots(counters, "rate#a", 100, 2, 3)) == [(101, 2, 0)]


def test_a_cap_too_low_for_the_traffic_says_so() -> None:
    def always_full(_key: str, _second: int, positions: Sequence[int]) -> list[int]:
        return [10**9] * len(positions)

    with pytest.raises(NoReleaseSlotError, match=r"release cap of 'a' \(1/s\) cannot place"):
        release_slots(always_full, "rate#a", 100, 1, 1)


def test_past_full_seconds_the_probe_gallops_and_never_exceeds_the_cap() -> None:
    counters = DictCounters()
    for second in range(100, 1100):  # a long burst another container placed
        counters.values["rate#a", second] = 3
    slots = summary(release_slots(counters, "rate#a", 100, 5, 3))
    assert counters.claims < 40  # not one claim per full second
    assert sum(n for _, n, _ in slots) == 5
    assert all(second >= 1100 for second, _, _ in slots)
    assert all(n <= 3 for _, n, _ in slots)
    # Once a second has room, the next ones are taken in order again.
    (first, _, _), (second, _, _) = slots
    assert second == first + 1


@pytest.fixture
def store(aws: AwsResources) -> MessageStore:
    return counted_store(aws)[0]


def counted_store(aws: AwsResources) -> tuple[MessageStore, ClientProxy]:
    proxy = ClientProxy(
        aws.dynamodb,
        update_item=aws.dynamodb.update_item,
        batch_get_item=aws.dynamodb.batch_get_item,
    )
    return store_of(proxy, aws.settings), proxy


def burst(
    tenant: str, count: int, due_ms: int = DUE_S * 1000 + 250, **kw: Any
) -> list[DelayRequest]:
    """``count`` of ``tenant``'s requests, each at its own offset of ``tenant``'s partition."""
    return [
        dataclasses.replace(
            delay_request(delay_id=f"{tenant}-{i}", due_ms=due_ms, src=f"delay-{tenant}-0-{i}"),
            tenant=tenant,
            **kw,
        )
        for i in range(count)
    ]


def more(
    tenant: str, count: int, prefix: str = "more", first: int = 100, **kw: Any
) -> list[DelayRequest]:
    """Other records of ``tenant``'s: new ids (``prefix``) from offset ``first`` on."""
    return [
        dataclasses.replace(
            r, delay_id=f"{prefix}-{r.delay_id}", src=f"delay-{tenant}-0-{first + i}"
        )
        for i, r in enumerate(burst(tenant, count, **kw))
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
    early = more("bulk", 3, prefix="e")
    admission = shaper.admit(late + early, NOW_MS, Deadline.after(30))
    released = {r.delay_id: r.release_at_ms for r in admission.admitted}
    assert max(released[r.delay_id] for r in early) <= min(released[r.delay_id] for r in late)


def test_containers_sharing_a_cap_never_exceed_it(aws: AwsResources) -> None:
    limits = parse_limits('{"bulk": {"release_per_second": 7}}')
    containers = [Shaper(counted_store(aws)[0], limits) for _ in range(3)]
    admitted: list[DelayRequest] = []
    for round_ in range(4):
        for n, shaper in enumerate(containers):
            batch = more("bulk", 5, prefix=f"{round_}-{n}", first=(round_ * 3 + n) * 5)
            admitted += shaper.admit(batch, NOW_MS, Deadline.after(30)).admitted
    assert len(admitted) == 60
    assert max(per_second(admitted).values()) <= 7
    assert min(per_second(admitted)) == DUE_S


def test_a_batch_admitted_again_gets_its_slots_again_and_counts_nothing_more(
    aws: AwsResources,
) -> None:
    limits = parse_limits('{"bulk": {"release_per_second": 5}}')
    first = Shaper(counted_store(aws)[0], limits).admit(
        burst("bulk", 12), NOW_MS, Deadline.after(30)
    )
    # Redelivered, to another container, a while later.
    again = Shaper(counted_store(aws)[0], limits).admit(
        burst("bulk", 12), NOW_MS + 5_000, Deadline.after(30)
    )
    assert again.admitted == first.admitted
    assert per_second(first.admitted) == {DUE_S: 5, DUE_S + 1: 5, DUE_S + 2: 2}
    # The counters hold the first attempt's claims only (12, then the 7 and 2 left).
    counted = [
        aws.dynamodb.get_item(
            TableName=aws.settings.table_name,
            Key={"pk": {"S": f"rate#bulk#{second}"}, "sk": {"S": "-"}},
        )["Item"]["n"]["N"]
        for second in range(DUE_S, DUE_S + 3)
    ]
    assert counted == ["12", "7", "2"]


def test_over_its_quota_a_tenant_is_rejected_and_the_next_second_admits_again(
    store: MessageStore,
) -> None:
    shaper = Shaper(store, parse_limits('{"noisy": {"ingest_per_second": 5}}'))
    first = shaper.admit(burst("noisy", 8, ts_ms=NOW_MS), NOW_MS, Deadline.after(30))
    assert [r.delay_id for r in first.admitted] == [f"noisy-{i}" for i in range(5)]
    assert [r.delay_id for r, _ in first.refused] == [f"noisy-{i}" for i in range(5, 8)]
    assert {why for _, why in first.refused} == {
        "tenant 'noisy' is over its ingest quota of 5 messages/s"
    }
    assert first.deferred == 0
    # Counted by the records' timestamps, whenever they are ingested.
    same_second = shaper.admit(
        more("noisy", 2, ts_ms=NOW_MS + 999 - NOW_MS % 1000), NOW_MS + 5000, Deadline.after(30)
    )
    assert (len(same_second.admitted), len(same_second.refused)) == (0, 2)
    next_second = shaper.admit(more("noisy", 2, ts_ms=NOW_MS + 1000), NOW_MS, Deadline.after(30))
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


def test_a_capped_tenant_deferred_over_its_quota_never_gets_more_than_its_cap_in_a_second(
    store: MessageStore,
) -> None:
    # Found by the simulator (seed 0 of `python -m sim --limits`): the deferred messages had
    # their own counter, so a second held the cap's messages and the quota's on top.
    limits = '{"noisy": {"release_per_second": 3, "ingest_per_second": 4, "over_quota": "defer"}}'
    shaper = Shaper(store, parse_limits(limits))
    admission = shaper.admit(burst("noisy", 12), NOW_MS, Deadline.after(30))
    assert (admission.deferred, len(admission.admitted), admission.refused) == (8, 12, [])
    assert all(r.release_at_ms >= r.due_ms for r in admission.admitted)
    per_second = Counter(buckets.due_second(r.release_at_ms) for r in admission.admitted)
    assert sorted(per_second.items()) == [(DUE_S + n, 3) for n in range(4)]


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
    late = more("bulk", 3, prefix="late")
    refused = shaper.admit(late, NOW_MS, Deadline.after(30)).refused
    assert [r.delay_id for r, _ in refused] == ["late-bulk-0", "late-bulk-1", "late-bulk-2"]
    assert "release cap of 'bulk' (2/s) cannot place it within 2 s" in refused[0][1]


# --- while the pipeline catches up (the emitter's side of a release cap) -------------------

NOW_S = NOW_MS // 1000
CAPS = parse_limits('{"bulk": {"release_per_second": 5}, "other": {"release_per_second": 5}}')


@pytest.mark.parametrize(
    ("release_at_ms", "now_ms", "cap"),
    [
        (NOW_S * 1000 - 1, NOW_S * 1000, 5),  # its second has just passed
        (NOW_S * 1000 - 3_600_000, NOW_S * 1000 + 999, 5),  # an hour behind
        (NOW_S * 1000, NOW_S * 1000 + 999, None),  # still its second: on time
        (NOW_S * 1000 + 2000, NOW_S * 1000, None),  # not due yet
    ],
)
def test_a_message_missed_its_slot_only_once_its_second_has_passed(
    release_at_ms: int, now_ms: int, cap: int | None
) -> None:
    request = dataclasses.replace(delay_request(due_ms=release_at_ms), tenant="bulk")
    assert missed_slot_cap(request, CAPS, now_ms) == cap


def test_a_tenant_without_a_cap_never_missed_a_slot() -> None:
    request = dataclasses.replace(delay_request(due_ms=NOW_MS - 60_000), tenant="free")
    assert missed_slot_cap(request, CAPS, NOW_MS) is None


def late(tenant: str, count: int, seconds_late: int = 60, **kw: Any) -> list[DelayRequest]:
    return burst(tenant, count, due_ms=(NOW_S - seconds_late) * 1000 + 250, **kw)


def test_on_time_and_uncapped_messages_make_no_claim(aws: AwsResources) -> None:
    store, proxy = counted_store(aws)
    shaper = Shaper(store, CAPS)
    requests = burst("bulk", 5, due_ms=NOW_MS + 500) + late("free", 5)
    plan = shaper.catch_up(requests, NOW_MS, Deadline.after(30))
    assert (plan.slots, plan.unplaced) == ({}, {})
    assert proxy.calls == []


# Late messages claim from the emitter's hold (+ a margin) ahead on: the on-time messages of
# those seconds have not been checked yet.
FIRST_S = (NOW_MS + c.DEFAULT_MAX_HOLD_MS + c.RESCHEDULE_MARGIN_MS) // 1000 + 1


def test_late_messages_go_first_from_the_claim_lead_on(aws: AwsResources) -> None:
    store, proxy = counted_store(aws)
    # Ingest gave three of that second's five slots to messages then on time: late messages
    # count apart (``l``) and take the whole cap; those three are displaced when they come.
    store.claim_counter(f"rate#bulk#{FIRST_S}", 3, "c-ingest", FIRST_S + 60, Deadline.after(30))
    proxy.calls.clear()
    plan = Shaper(store, CAPS).catch_up(late("bulk", 9), NOW_MS, Deadline.after(30))
    assert plan.unplaced == {}
    assert Counter(ms // 1000 for ms in plan.slots.values()) == {FIRST_S: 5, FIRST_S + 1: 4}
    assert all(ms % 1000 == 0 for ms in plan.slots.values())
    assert len(proxy.calls) == 2  # one claim per second touched, not per message
    # The seconds it filled grant nothing more to late messages (an add may overshoot the
    # count, never the cap): the next ones go after them.
    other = Shaper(store, CAPS)  # another container, with no memory of full seconds
    more = other.catch_up(late("bulk", 4, seconds_late=1), NOW_MS, Deadline.after(30))
    assert Counter(ms // 1000 for ms in more.slots.values()) == {FIRST_S + 1: 1, FIRST_S + 2: 3}


def ranked(tenant: str, count: int, second: int) -> list[DelayRequest]:
    """``count`` on-time messages ingest placed in ``second`` with ranks 0, 1, ..."""
    return [
        dataclasses.replace(r, release_rank=n)
        for n, r in enumerate(burst(tenant, count, due_ms=second * 1000 + 100))
    ]


def test_on_time_messages_past_what_late_ones_left_are_displaced(aws: AwsResources) -> None:
    store, proxy = counted_store(aws)
    store.claim_counter(
        f"rate#bulk#{FIRST_S}", 2, "c-late", FIRST_S + 60, Deadline.after(30), counter="l"
    )
    proxy.calls.clear()
    on_time = ranked("bulk", 5, FIRST_S)  # the cap's five, counted by ingest
    shaper = Shaper(store, CAPS)
    assert shaper.displaced(on_time, FIRST_S * 1000, Deadline.after(30)) == {3, 4}
    assert [name for name, _ in proxy.calls] == ["batch_get_item"]  # one read, not five
    # They take late slots themselves, after the late ones already placed.
    plan = shaper.catch_up(on_time, FIRST_S * 1000, Deadline.after(30))
    assert set(plan.slots) == {3, 4}
    lead_s = (FIRST_S * 1000 + c.DEFAULT_MAX_HOLD_MS + c.RESCHEDULE_MARGIN_MS) // 1000 + 1
    assert all(ms // 1000 >= lead_s for ms in plan.slots.values())


def test_on_time_messages_without_late_ones_stay(aws: AwsResources) -> None:
    store, proxy = counted_store(aws)
    plan = Shaper(store, CAPS).catch_up(ranked("bulk", 5, NOW_S), NOW_MS, Deadline.after(30))
    assert (plan.slots, plan.unplaced) == ({}, {})
    assert [name for name, _ in proxy.calls] == ["batch_get_item"]


def test_a_claim_answered_after_its_seconds_deadline_is_not_used(store: MessageStore) -> None:
    # The claim's response came when the claimed second's on-time messages may already have
    # been checked: the slot is left (wasted room, never over the cap).
    late_answer = iter([NOW_MS + 10_000])
    plan = Shaper(store, CAPS).catch_up(
        late("bulk", 1), NOW_MS, Deadline.after(30), clock=lambda: next(late_answer)
    )
    assert (plan.slots, plan.unplaced, plan.again) == ({}, {}, {0})


def test_late_messages_keep_their_release_order(store: MessageStore) -> None:
    older = late("bulk", 3, seconds_late=120)
    newer = [
        dataclasses.replace(r, delay_id=f"n-{r.delay_id}", src=f"{r.src}-n")
        for r in late("bulk", 4, 30)
    ]
    plan = Shaper(store, CAPS).catch_up(newer + older, NOW_MS, Deadline.after(30))
    slot_of_older = [plan.slots[i] for i in range(4, 7)]
    slot_of_newer = [plan.slots[i] for i in range(4)]
    assert max(slot_of_older) <= min(slot_of_newer)
    assert len(plan.slots) == 7


def test_a_counter_that_fails_leaves_only_its_tenant_unplaced(aws: AwsResources) -> None:
    def update_item(**kwargs: Any) -> Any:
        if kwargs["Key"]["pk"]["S"].startswith("rate#bulk#"):
            raise client_error("ProvisionedThroughputExceededException")
        return aws.dynamodb.update_item(**kwargs)

    store = store_of(ClientProxy(aws.dynamodb, update_item=update_item), aws.settings)
    requests = late("bulk", 2) + late("other", 2)
    plan = Shaper(store, CAPS).catch_up(requests, NOW_MS, Deadline.after(30))
    assert set(plan.unplaced) == {0, 1}
    assert "ProvisionedThroughputExceededException" in plan.unplaced[0]
    assert {i: ms // 1000 for i, ms in plan.slots.items()} == {2: FIRST_S, 3: FIRST_S}


def test_a_tenant_full_for_the_catch_up_spread_is_left_unplaced_then_not_probed_again(
    aws: AwsResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(c, "CATCH_UP_SPREAD_SECONDS", 3)
    store, proxy = counted_store(aws)
    for second in range(FIRST_S, FIRST_S + 10):
        store.claim_counter(
            f"rate#bulk#{second}", 5, "c-late", second + 60, Deadline.after(30), counter="l"
        )
    proxy.calls.clear()
    shaper = Shaper(store, CAPS)
    plan = shaper.catch_up(late("bulk", 1), NOW_MS, Deadline.after(30))
    assert plan.slots == {}
    assert "release cap of 'bulk' (5/s) cannot place it within 3 s" in plan.unplaced[0]
    claims = len(proxy.calls)
    # This container remembers the full seconds: the next batch costs no claim there.
    again = shaper.catch_up(late("bulk", 1), NOW_MS, Deadline.after(30))
    assert set(again.unplaced) == {0}
    assert len(proxy.calls) == claims
