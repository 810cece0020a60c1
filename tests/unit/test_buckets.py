"""Time buckets and horizon arithmetic: routing, SQS delays, the scheduling window, ticks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import buckets
from delayq.buckets import Route
from delayq.settings import Settings
from testkit.clock import NOW_MS
from tests.factories import PROPERTY

HORIZON = 900
LOOKAHEAD = 840
NOW_S = NOW_MS // 1000


# --- due seconds and bucket keys ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("due_ms", "second"),
    [
        (0, 0),
        (999, 0),
        (1000, 1),
        (NOW_MS + 1999, NOW_S + 1),
        (-1, -1),
        (-1000, -1),
        (-1001, -2),
    ],
)
def test_due_second_floors_also_below_zero(due_ms: int, second: int) -> None:
    assert buckets.due_second(due_ms) == second


def test_bucket_key_is_second_hash_shard() -> None:
    assert buckets.bucket_key(NOW_S, 3) == f"{NOW_S}#3"


@pytest.mark.parametrize(("second", "shard"), [(NOW_S, 0), (NOW_S, 15), (-5, 2), (0, 0)])
def test_parse_bucket_key_inverts_bucket_key(second: int, shard: int) -> None:
    assert buckets.parse_bucket_key(buckets.bucket_key(second, shard)) == (second, shard)


def test_bucket_keys_lists_every_shard_of_one_second_in_order() -> None:
    assert buckets.bucket_keys(100, 4) == ["100#0", "100#1", "100#2", "100#3"]


# --- shards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay_id", "shards", "shard"),
    [
        # CRC-32 of "123456789" is the standard check value 0xCBF43926 = 3421780262.
        ("123456789", 1000, 262),
        ("123456789", 16, 6),
        ("123456789", 1, 0),
        ("order-1", 16, 15),
        ("order-2", 16, 5),
        ("order-1", 4, 3),
        ("заказ-7", 16, 2),
        ("delay-requests-0-0", 16, 15),
        ("", 16, 0),
    ],
)
def test_shard_of_is_crc32_modulo_shards(delay_id: str, shards: int, shard: int) -> None:
    assert buckets.shard_of(delay_id, shards) == shard


@PROPERTY
@given(delay_id=st.text(max_size=64), shards=st.integers(min_value=1, max_value=256))
def test_shard_of_is_in_range(delay_id: str, shards: int) -> None:
    assert 0 <= buckets.shard_of(delay_id, shards) < shards


def test_shard_of_spreads_sequential_ids_over_every_shard() -> None:
    used = {buckets.shard_of(f"order-{i}", 16) for i in range(200)}
    assert used == set(range(16))


# --- routing -----------------------------------------------------------------------------------


def test_route_at_exactly_the_horizon_goes_to_the_queue() -> None:
    assert buckets.route(NOW_MS + HORIZON * 1000, NOW_MS, HORIZON) is Route.QUEUE


def test_route_one_ms_beyond_the_horizon_goes_to_the_store() -> None:
    assert buckets.route(NOW_MS + HORIZON * 1000 + 1, NOW_MS, HORIZON) is Route.STORE


@pytest.mark.parametrize("offset_ms", [-86_400_000, -1, 0, 1, 999])
def test_route_due_now_or_in_the_past_goes_to_the_queue(offset_ms: int) -> None:
    assert buckets.route(NOW_MS + offset_ms, NOW_MS, HORIZON) is Route.QUEUE


@pytest.mark.parametrize(
    ("skew_ms", "offset_ms", "expected"),
    [
        # A clock 2 s fast sees everything 2 s closer: the boundary moves 2 s later.
        (2000, HORIZON * 1000 + 2000, Route.QUEUE),
        (2000, HORIZON * 1000 + 2001, Route.STORE),
        # A clock 2 s slow sees everything 2 s further: the boundary moves 2 s earlier.
        (-2000, HORIZON * 1000 - 2000, Route.QUEUE),
        (-2000, HORIZON * 1000 - 1999, Route.STORE),
    ],
)
def test_clock_skew_shifts_the_routing_boundary_by_the_skew(
    skew_ms: int, offset_ms: int, expected: Route
) -> None:
    assert buckets.route(NOW_MS + offset_ms, NOW_MS + skew_ms, HORIZON) is expected


@pytest.mark.parametrize("scheduler_skew_ms", [-2000, 0, 2000])
@pytest.mark.parametrize("ingest_skew_ms", [-2000, 0, 2000])
@pytest.mark.parametrize("offset_ms", [HORIZON * 1000 + step * 250 for step in range(-12, 13)])
def test_stored_under_skew_is_beyond_a_skewed_schedulers_window(
    ingest_skew_ms: int, scheduler_skew_ms: int, offset_ms: int
) -> None:
    """Whatever ingest stores (its clock 2 s off) lies beyond the last second a scheduler
    (its clock 2 s off the other way) has already queued: the look-ahead gap absorbs skew."""
    due_ms = NOW_MS + offset_ms
    window = buckets.scheduling_window(NOW_S - 1, NOW_MS + scheduler_skew_ms, LOOKAHEAD)
    routed = buckets.route(due_ms, NOW_MS + ingest_skew_ms, HORIZON)
    assert routed is Route.QUEUE or buckets.due_second(due_ms) > window[-1]


# --- SQS delays --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait_ms", "lead_ms", "seconds"),
    [
        (0, 0, 0),
        (999, 0, 0),
        (1000, 0, 1),
        (5999, 0, 5),
        (6000, 0, 6),
        (6000, 1000, 5),
        (6999, 1000, 5),
        (1500, 1000, 0),
        (900_000, 0, 900),
        (900_999, 0, 900),
        (901_000, 0, 900),
        (7 * 86_400_000, 0, 900),
        (-5000, 0, 0),
        (-5000, 1000, 0),
    ],
)
def test_queue_delay_seconds_rounds_down_and_clamps(
    wait_ms: int, lead_ms: int, seconds: int
) -> None:
    assert buckets.queue_delay_seconds(NOW_MS + wait_ms, NOW_MS, lead_ms) == seconds


@pytest.mark.parametrize("lead_ms", [0, 1, 500, 1000, 1500, 3000])
@pytest.mark.parametrize(
    "wait_ms",
    [-1000, 0, 1, 499, 999, 1000, 1001, 1500, 59_999, 60_000, 60_001, 899_001, 899_999, 900_000],
)
def test_queue_release_is_never_after_due_minus_lead(wait_ms: int, lead_ms: int) -> None:
    due_ms = NOW_MS + wait_ms
    release_ms = NOW_MS + buckets.queue_delay_seconds(due_ms, NOW_MS, lead_ms) * 1000
    assert release_ms <= max(NOW_MS, due_ms - lead_ms)


@PROPERTY
@given(
    wait_ms=st.integers(min_value=-10_000_000, max_value=HORIZON * 1000),
    lead_ms=st.integers(min_value=0, max_value=3000),
)
def test_queue_release_is_at_most_one_second_before_due_minus_lead(
    wait_ms: int, lead_ms: int
) -> None:
    due_ms = NOW_MS + wait_ms
    seconds = buckets.queue_delay_seconds(due_ms, NOW_MS, lead_ms)
    release_ms = NOW_MS + seconds * 1000
    assert 0 <= seconds <= 900
    assert release_ms <= max(NOW_MS, due_ms - lead_ms)
    assert max(NOW_MS, due_ms - lead_ms) - release_ms < 1000


@pytest.mark.parametrize(
    ("wait_ms", "lead_ms", "seconds"),
    [
        (-1, 0, 0),
        (0, 0, 0),
        (3500, 1000, 2),
        (3999, 0, 3),
        (43_200_000, 0, 43_200),
        (50_000_000, 0, 43_200),
    ],
)
def test_visibility_delay_seconds_rounds_down_and_clamps_at_12_hours(
    wait_ms: int, lead_ms: int, seconds: int
) -> None:
    assert buckets.visibility_delay_seconds(NOW_MS + wait_ms, NOW_MS, lead_ms) == seconds


# --- the scheduling window ---------------------------------------------------------------------


def test_scheduling_window_runs_from_after_the_watermark_to_now_plus_lookahead() -> None:
    window = buckets.scheduling_window(NOW_S + 800, NOW_MS + 999, LOOKAHEAD)
    assert (window.start, window[-1]) == (NOW_S + 801, NOW_S + LOOKAHEAD)


def test_scheduling_window_is_empty_for_a_repeated_tick() -> None:
    first = buckets.scheduling_window(NOW_S - 1, NOW_MS, LOOKAHEAD)
    repeated = buckets.scheduling_window(first[-1], NOW_MS + 999, LOOKAHEAD)
    assert len(first) == LOOKAHEAD + 1
    assert len(repeated) == 0


def test_scheduling_window_catches_up_every_second_after_missed_ticks() -> None:
    watermark = NOW_S + LOOKAHEAD
    window = buckets.scheduling_window(watermark, NOW_MS + 3 * 60_000, LOOKAHEAD)
    assert list(window) == list(range(watermark + 1, watermark + 181))


def test_scheduling_window_is_empty_when_the_clock_is_behind_the_watermark() -> None:
    assert len(buckets.scheduling_window(NOW_S + LOOKAHEAD, NOW_MS - 2000, LOOKAHEAD)) == 0


def test_lookahead_is_shorter_than_the_horizon_by_default() -> None:
    defaults = Settings()
    assert (defaults.horizon_seconds, defaults.lookahead_seconds) == (HORIZON, LOOKAHEAD)


# --- ticks -------------------------------------------------------------------------------------


def test_tick_index_is_the_epoch_minute_with_the_default_tick() -> None:
    # NOW_MS is 2026-11-21T08:00:00Z, the start of epoch minute 29,920,800.
    assert buckets.tick_index(NOW_MS, 60) == 29_920_800


@pytest.mark.parametrize("offset_ms", [0, 1, 30_000, 59_999])
def test_tick_ids_are_identical_within_one_period(offset_ms: int) -> None:
    assert buckets.tick_dedup_id(buckets.tick_index(NOW_MS + offset_ms, 60)) == "tick-29920800"


@pytest.mark.parametrize(
    ("offset_ms", "expected"), [(-1, "tick-29920799"), (60_000, "tick-29920801")]
)
def test_tick_ids_differ_across_periods(offset_ms: int, expected: str) -> None:
    assert buckets.tick_dedup_id(buckets.tick_index(NOW_MS + offset_ms, 60)) == expected


def test_tick_index_follows_a_compressed_tick_period() -> None:
    assert buckets.tick_index(NOW_MS + 4999, 5) == buckets.tick_index(NOW_MS, 5)
    assert buckets.tick_index(NOW_MS + 5000, 5) == buckets.tick_index(NOW_MS, 5) + 1


# --- TTL ---------------------------------------------------------------------------------------


def test_expires_at_a_whole_due_second_is_due_plus_grace() -> None:
    assert buckets.expires_at(NOW_MS, 86_400) == NOW_S + 86_400


@pytest.mark.parametrize("remainder_ms", [1, 500, 999])
def test_expires_at_is_never_before_due_plus_grace(remainder_ms: int) -> None:
    due_ms = NOW_MS + remainder_ms
    assert buckets.expires_at(due_ms, 60) == NOW_S + 61
    assert buckets.expires_at(due_ms, 60) * 1000 >= due_ms + 60_000


# --- late ranges -------------------------------------------------------------------------------

GRACE = 3600
NOW_S = NOW_MS // 1000


def test_the_late_cutoff_is_where_ttl_may_have_started_less_the_clock_margin() -> None:
    # A message due at second s expires at s + grace: by now, seconds up to now - grace may
    # have lost messages to TTL; the margin covers clocks that disagree by minutes.
    assert buckets.late_cutoff(NOW_MS, GRACE, 300) == NOW_S - GRACE + 300


def late(ranges: buckets.Ranges, first: int, last: int, cutoff: int) -> buckets.Ranges:
    return buckets.add_late(
        ranges, first, last, cutoff=cutoff, now_ms=NOW_MS, ttl_grace_seconds=GRACE
    )


def test_seconds_passed_before_the_cutoff_are_not_late() -> None:
    assert late((), NOW_S - 10, NOW_S, cutoff=NOW_S - 11) == ()


def test_seconds_up_to_the_cutoff_are_late() -> None:
    assert late((), NOW_S - 10, NOW_S, cutoff=NOW_S - 4) == ((NOW_S - 10, NOW_S - 4),)


def test_an_adjacent_range_is_extended_a_distant_one_added() -> None:
    first = late((), NOW_S - 10, NOW_S - 5, cutoff=NOW_S)
    assert late(first, NOW_S - 4, NOW_S - 2, cutoff=NOW_S) == ((NOW_S - 10, NOW_S - 2),)
    assert late(first, NOW_S - 1, NOW_S, cutoff=NOW_S) == (
        (NOW_S - 10, NOW_S - 5),
        (NOW_S - 1, NOW_S),
    )


def test_ranges_whose_ttl_removals_are_long_past_are_dropped() -> None:
    keep = buckets.due_second(NOW_MS) - GRACE - 30 * 86400
    old = ((keep - 100, keep - 1), (keep - 1, keep + 5))
    assert late(old, NOW_S + 1, NOW_S + 2, cutoff=NOW_S) == ((keep - 1, keep + 5),)


def test_too_many_ranges_merge_the_oldest_which_only_widens_them() -> None:
    ranges = tuple((NOW_S - 1000 + 10 * i, NOW_S - 1000 + 10 * i + 1) for i in range(64))
    grown = late(ranges, NOW_S, NOW_S, cutoff=NOW_S)
    assert len(grown) == 64
    assert grown[0] == (ranges[0][0], ranges[1][1])
    assert grown[-1] == (NOW_S, NOW_S)
    covered = {s for a, b in grown for s in range(a, b + 1)}
    assert all(s in covered for a, b in ranges for s in range(a, b + 1))


@PROPERTY
@given(st.lists(st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 1000)), max_size=70))
def test_ranges_survive_their_stored_form(pairs: list[tuple[int, int]]) -> None:
    ranges = tuple((a, a + width) for a, width in pairs)
    assert buckets.parse_ranges(buckets.format_ranges(ranges)) == ranges
