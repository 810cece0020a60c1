"""The emitter's delivery statistics: histogram buckets, item layout, flush policy."""

from __future__ import annotations

import pytest

from delayq import stats
from delayq.stats import BOUNDS_MS, BUCKETS, DeliveryStats, FlushPolicy, TargetStats

MINUTE = 29_000_000  # an epoch minute in 2025
T0 = MINUTE * 60_000  # its first millisecond


def hist(**counts: int) -> list[int]:
    """A histogram with `b<index>=count` set, the rest zero."""
    values = [0] * BUCKETS
    for name, count in counts.items():
        values[int(name[1:])] = count
    return values


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


@pytest.mark.parametrize(
    ("lateness_ms", "bucket"),
    [
        (-5000, 0),
        (-1, 0),
        (0, 0),
        (1, 1),
        (10, 1),
        (11, 2),
        (500, 8),
        (501, 9),
        (2000, 12),
        (2001, 13),
        (60000, 17),
        (60001, 18),
        (10**9, 18),
    ],
)
def test_bucket_index_is_upper_bound_inclusive(lateness_ms: int, bucket: int) -> None:
    assert stats.bucket_index(lateness_ms) == bucket


def test_bounds_are_the_documented_ones() -> None:
    assert BOUNDS_MS[:13] == (0, 10, 25, 50, 100, 200, 300, 400, 500, 750, 1000, 1500, 2000)
    assert BUCKETS == 19
    assert stats.BOUNDS_ATTRIBUTE == (
        "0,10,25,50,100,200,300,400,500,750,1000,1500,2000,3000,5000,10000,30000,60000"
    )


def test_target_stats_counts_exact_values() -> None:
    target = TargetStats()
    for lateness in (0, 2000, -30, 499, 60001):
        target.add(lateness)

    assert target == TargetStats(
        messages=5,
        early=1,
        late_sum_ms=62470,
        late_min_ms=-30,
        late_max_ms=60001,
        hist=hist(b0=2, b8=1, b12=1, b18=1),
    )


def test_first_observation_sets_min_and_max_even_when_positive() -> None:
    target = TargetStats()
    target.add(700)
    assert (target.late_min_ms, target.late_max_ms) == (700, 700)


def test_flush_all_gives_one_item_per_minute_with_all_targets() -> None:
    acc = DeliveryStats(instance_id="i-1", retention_seconds=3600)
    acc.add("orders", due_ms=T0 + 1000, emitted_ms=T0 + 1000)  # on time
    acc.add("orders", due_ms=T0 + 1000, emitted_ms=T0 + 3000)  # exactly 2 s late
    acc.add("alerts", due_ms=T0 + 5000, emitted_ms=T0 + 4990)  # 10 ms early

    assert acc.flush_all() == [
        {
            "pk": {"S": f"stats#{MINUTE}"},
            "sk": {"S": "i-1#0#0"},
            "kind": {"S": "stats"},
            "minute": n(MINUTE),
            "bounds_ms": {"S": stats.BOUNDS_ATTRIBUTE},
            "targets": {
                "M": {
                    "alerts": {
                        "M": {
                            "messages": n(1),
                            "early": n(1),
                            "late_sum_ms": n(-10),
                            "late_min_ms": n(-10),
                            "late_max_ms": n(-10),
                            "hist": {"L": [n(v) for v in hist(b0=1)]},
                        }
                    },
                    "orders": {
                        "M": {
                            "messages": n(2),
                            "early": n(0),
                            "late_sum_ms": n(2000),
                            "late_min_ms": n(0),
                            "late_max_ms": n(2000),
                            "hist": {"L": [n(v) for v in hist(b0=1, b12=1)]},
                        }
                    },
                }
            },
            "expires_at": n((MINUTE + 1) * 60 + 3600),
        }
    ]
    assert acc.pending == 0
    assert acc.flush_all() == []


def test_messages_are_filed_under_their_emission_minute() -> None:
    acc = DeliveryStats(instance_id="i-1")
    acc.add("orders", due_ms=T0 + 59_000, emitted_ms=T0 + 59_999)
    acc.add("orders", due_ms=T0 + 59_000, emitted_ms=T0 + 60_000)

    items = acc.flush_all()

    assert [(i["pk"]["S"], i["sk"]["S"]) for i in items] == [
        (f"stats#{MINUTE}", "i-1#0#0"),
        (f"stats#{MINUTE + 1}", "i-1#0#0"),
    ]
    assert [i["targets"]["M"]["orders"]["M"]["late_max_ms"] for i in items] == [n(999), n(1000)]


def test_no_ttl_when_retention_is_none() -> None:
    acc = DeliveryStats(instance_id="i-1", retention_seconds=None)
    acc.add("orders", due_ms=T0, emitted_ms=T0)
    assert "expires_at" not in acc.flush_all()[0]


def test_default_ttl_is_ninety_days_after_the_minute() -> None:
    acc = DeliveryStats(instance_id="i-1")
    acc.add("orders", due_ms=T0, emitted_ms=T0)
    assert acc.flush_all()[0]["expires_at"] == n((MINUTE + 1) * 60 + 90 * 86400)


def test_each_flush_gets_a_new_sort_key() -> None:
    acc = DeliveryStats(instance_id="i-1")
    acc.add("orders", due_ms=T0, emitted_ms=T0 + 5)
    first = acc.flush_all()
    acc.add("orders", due_ms=T0, emitted_ms=T0 + 7)
    second = acc.flush_all()

    assert [i["sk"]["S"] for i in first + second] == ["i-1#0#0", "i-1#1#0"]
    assert [i["pk"]["S"] for i in first + second] == [f"stats#{MINUTE}"] * 2


def test_many_targets_are_split_into_parts() -> None:
    acc = DeliveryStats(instance_id="i-1")
    for i in range(stats.MAX_TARGETS_PER_ITEM + 1):
        acc.add(f"topic-{i:04d}", due_ms=T0, emitted_ms=T0)

    items = acc.flush_all()

    assert [i["sk"]["S"] for i in items] == ["i-1#0#0", "i-1#0#1"]
    assert [len(i["targets"]["M"]) for i in items] == [stats.MAX_TARGETS_PER_ITEM, 1]
    assert {i["pk"]["S"] for i in items} == {f"stats#{MINUTE}"}


def test_default_instance_ids_differ() -> None:
    assert DeliveryStats().instance_id != DeliveryStats().instance_id


@pytest.mark.parametrize("kwargs", [{"instance_id": ""}, {"retention_seconds": -1}])
def test_bad_arguments_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must"):
        DeliveryStats(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"max_messages": 0}, {"max_age_ms": 0}])
def test_bad_policy_is_rejected(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        FlushPolicy(**kwargs)


def minutes_flushed(items: list[stats.Item]) -> list[int]:
    return [int(i["minute"]["N"]) - MINUTE for i in items]


class TestFlushPolicy:
    def test_nothing_pending_never_flushes(self) -> None:
        acc = DeliveryStats(instance_id="i-1")
        assert not acc.should_flush(T0 + 10 * 60_000)
        assert acc.flush(T0 + 10 * 60_000) == []

    def test_current_minute_with_few_messages_waits(self) -> None:
        acc = DeliveryStats(instance_id="i-1", policy=FlushPolicy(max_messages=3))
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 100)
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 200)
        assert not acc.should_flush(T0 + 59_999)
        assert acc.flush(T0 + 59_999) == []
        assert acc.pending == 2

    def test_count_reaching_max_messages_flushes_the_current_minute(self) -> None:
        acc = DeliveryStats(instance_id="i-1", policy=FlushPolicy(max_messages=3))
        for _ in range(3):
            acc.add("orders", due_ms=T0, emitted_ms=T0 + 100)
        assert acc.pending == 3
        assert acc.should_flush(T0 + 100)
        assert minutes_flushed(acc.flush(T0 + 100)) == [0]
        assert acc.pending == 0

    def test_a_completed_minute_flushes_alone(self) -> None:
        acc = DeliveryStats(instance_id="i-1")
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 59_000)
        assert not acc.should_flush(T0 + 59_999)
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 60_500)

        assert acc.should_flush(T0 + 60_600)
        assert minutes_flushed(acc.flush(T0 + 60_600)) == [0]
        assert acc.pending == 1  # the new minute keeps filling

    def test_age_flushes_within_the_minute(self) -> None:
        acc = DeliveryStats(instance_id="i-1", policy=FlushPolicy(max_age_ms=10_000))
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 1_000)
        assert not acc.should_flush(T0 + 10_999)
        assert acc.should_flush(T0 + 11_000)

    def test_age_counts_from_the_oldest_message_even_out_of_order(self) -> None:
        acc = DeliveryStats(instance_id="i-1", policy=FlushPolicy(max_age_ms=10_000))
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 5_000)
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 1_000)
        assert acc.should_flush(T0 + 11_000)

    def test_an_early_flush_of_the_open_minute_takes_completed_ones_too(self) -> None:
        acc = DeliveryStats(instance_id="i-1", policy=FlushPolicy(max_messages=2))
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 59_000)
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 61_000)
        acc.add("orders", due_ms=T0, emitted_ms=T0 + 62_000)
        assert minutes_flushed(acc.flush(T0 + 62_000)) == [0, 1]


def test_writes_per_message_stay_under_a_tenth_at_volume() -> None:
    """12 deliveries per environment-minute for an hour: one write per minute, 1/12 per message."""
    acc = DeliveryStats(instance_id="i-1")
    writes = delivered = 0
    for minute in range(60):
        for k in range(12):  # one invocation every 5 s, flushing at its end
            emitted = T0 + minute * 60_000 + k * 5_000 + 40
            acc.add("orders", due_ms=emitted - 40, emitted_ms=emitted)
            delivered += 1
            writes += len(acc.flush(emitted + 10))
    assert (delivered, writes, acc.pending) == (720, 59, 12)
    assert writes / delivered <= 0.1
