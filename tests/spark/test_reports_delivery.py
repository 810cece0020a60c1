"""Delivery report transforms on synthetic exports: exact rows, edges of buckets and windows."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from delayq.stats import Item
from delayq_reports import transforms as t
from delayq_reports.synthetic_exports import message_item, watermark_item
from tests.spark.conftest import DAY, MINUTE, NOW, delivered, raw_export, rows, ts

pytestmark = pytest.mark.spark

ORDERS_AT = NOW - 75 * MINUTE  # 20:05 UTC
ALERTS_AT = NOW - 10 * MINUTE  # 21:10 UTC
# orders: one early, exactly on time, exactly on the 500 ms / 1 s / 2 s bounds, one past 60 s.
ORDERS_LATENESS = (-5, 0, 10, 400, 500, 999, 1000, 2000, 2001, 70000)
ALERTS_LATENESS = (100, 100, 100, 3000)
COLUMNS = ["messages", "early", "within_500ms", "within_1s", "within_2s"]
COLUMNS += ["p50_ms", "p99_ms", "max_ms", "mean_ms"]


def orders_and_alerts() -> list[Item]:
    """Two emitters: `a` delivers half of orders in 20:05, `b` the rest in 20:06 and alerts."""
    first, second = ORDERS_LATENESS[:5], ORDERS_LATENESS[5:]
    items = delivered(*(("orders", ORDERS_AT - late, ORDERS_AT) for late in first), instance_id="a")
    items += delivered(
        *(("orders", ORDERS_AT + MINUTE - late, ORDERS_AT + MINUTE) for late in second),
        *(("alerts", ALERTS_AT - late, ALERTS_AT) for late in ALERTS_LATENESS),
        instance_id="b",
    )
    return items


@pytest.fixture(scope="module")
def stats(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> DataFrame:
    directory = tmp_path_factory.mktemp("delivery")
    return t.decode_stats(raw_export(spark, str(directory), orders_and_alerts())).cache()


def test_decode_stats_gives_one_row_per_item_and_topic(stats: DataFrame) -> None:
    decoded = rows(stats, "topic", "minute")

    assert [(r.topic, r.minute, r.messages, r.early, r.known_layout) for r in decoded] == [
        ("alerts", ALERTS_AT // MINUTE, 4, 0, True),
        ("orders", ORDERS_AT // MINUTE, 5, 1, True),
        ("orders", ORDERS_AT // MINUTE + 1, 5, 0, True),
    ]
    assert decoded[1].hist == [2, 1, 0, 0, 0, 0, 0, 1, 1] + [0] * 10
    assert (decoded[1].late_sum_ms, decoded[1].late_min_ms, decoded[1].late_max_ms) == (
        905,
        -5,
        500,
    )


def test_lateness_by_topic_exact(stats: DataFrame) -> None:
    by_topic = t.summarize_lateness(stats, "topic")

    assert by_topic.columns == ["topic", *COLUMNS]
    assert rows(by_topic, "topic") == [
        ("alerts", 4, 0, 0.75, 0.75, 0.75, 100, 3000, 3000, 825.0),
        # 2000 ms late is within 2 s, 2001 is not; the p99 falls in the overflow bucket: the max.
        ("orders", 10, 1, 0.5, 0.7, 0.8, 500, 70000, 70000, 7690.5),
    ]


def test_lateness_overall_merges_topics(stats: DataFrame) -> None:
    assert rows(t.summarize_lateness(stats)) == [
        (14, 1, 8 / 14, 10 / 14, 11 / 14, 400, 70000, 70000, 80205 / 14)
    ]


def test_percentile_is_the_bucket_upper_bound_capped_at_the_max(
    spark: SparkSession, tmp_path: Path
) -> None:
    # 99 at 120 ms and 1 at 1800 ms: p50 -> (100, 200] -> 200; p99 rank 99 -> 200; max 1800.
    deliveries = [("orders", NOW - 120 - MINUTE, NOW - MINUTE)] * 99
    deliveries.append(("orders", NOW - 1800 - MINUTE, NOW - MINUTE))
    summary = t.summarize_lateness(
        t.decode_stats(raw_export(spark, str(tmp_path), delivered(*deliveries)))
    )

    assert rows(summary.select("p50_ms", "p99_ms", "max_ms")) == [(200, 200, 1800)]


def test_lateness_exactly_two_seconds_is_within_two_seconds(
    spark: SparkSession, tmp_path: Path
) -> None:
    items = delivered(("orders", NOW - 2000 - MINUTE, NOW - MINUTE))
    summary = t.summarize_lateness(t.decode_stats(raw_export(spark, str(tmp_path), items)))

    assert rows(summary.select(*COLUMNS)) == [(1, 0, 0.0, 0.0, 1.0, 2000, 2000, 2000, 2000.0)]


def test_one_topic_overall_equals_the_topic(stats: DataFrame) -> None:
    alerts = stats.where("topic = 'alerts'")
    overall = rows(t.summarize_lateness(alerts))
    by_topic = rows(t.summarize_lateness(alerts, "topic").drop("topic"))
    assert overall == by_topic == [(4, 0, 0.75, 0.75, 0.75, 100, 3000, 3000, 825.0)]


def test_lateness_hourly_per_topic_and_hour(stats: DataFrame) -> None:
    hourly = t.lateness_hourly(stats)

    assert hourly.columns == ["topic", "hour", *COLUMNS]
    assert [(r.topic, r.hour, r.messages, r.p50_ms) for r in rows(hourly, "topic", "hour")] == [
        ("alerts", ts(NOW - 20 * MINUTE), 4, 100),
        ("orders", ts(NOW - 80 * MINUTE), 10, 500),
    ]


def test_lateness_histogram_merges_every_topic_per_bucket(stats: DataFrame) -> None:
    histogram = t.lateness_histogram(stats)

    assert histogram.columns == ["bucket", "le_ms", "messages"]
    found = rows(histogram, "bucket")
    assert [r.bucket for r in found] == list(range(t.BUCKETS))
    assert [r.le_ms for r in found] == [*t.BOUNDS_MS, None]
    # orders -5 and 0 -> bucket 0 (<= 0 ms); 10 -> 1; alerts 100 x 3 -> 4; 400 -> 7; 500 -> 8;
    # 999 and 1000 -> 10; 2000 -> 12; 2001 and alerts 3000 -> 13; 70000 -> 18 (overflow).
    expected = {0: 2, 1: 1, 4: 3, 7: 1, 8: 1, 10: 2, 12: 1, 13: 2, 18: 1}
    assert [r.messages for r in found] == [expected.get(i, 0) for i in range(t.BUCKETS)]


def test_volume_per_five_minutes_and_peak(stats: DataFrame) -> None:
    volume = t.volume_5min(stats)

    assert rows(volume, "window_start", "topic") == [
        (ts(ORDERS_AT), "orders", 10),
        (ts(ALERTS_AT), "alerts", 4),
    ]
    assert rows(t.volume_peak(volume)) == [(ts(ORDERS_AT), 10, 10 / 300)]


def test_peak_tie_goes_to_the_earliest_window(spark: SparkSession, tmp_path: Path) -> None:
    items = delivered(
        ("alerts", NOW - 30 * MINUTE, NOW - 30 * MINUTE),
        ("orders", NOW - 10 * MINUTE, NOW - 10 * MINUTE),
    )
    volume = t.volume_5min(t.decode_stats(raw_export(spark, str(tmp_path), items)))

    assert rows(t.volume_peak(volume)) == [(ts(NOW - 30 * MINUTE), 1, 1 / 300)]


def test_window_keeps_minutes_starting_in_it(spark: SparkSession, tmp_path: Path) -> None:
    start = NOW - 7 * DAY
    items = delivered(
        ("orders", start - MINUTE, start - 1),  # the minute before the window
        ("orders", start, start),  # the first minute of the window
        ("orders", NOW - 1, NOW - 1),  # the last minute before now
        ("orders", NOW, NOW),  # the minute starting now: not yet in
    )
    stats = t.decode_stats(raw_export(spark, str(tmp_path), items))

    kept = rows(t.stats_in_window(stats, start, NOW), "minute")

    assert [r.minute for r in kept] == [start // MINUTE, NOW // MINUTE - 1]


def test_unknown_histogram_layout_is_left_out(spark: SparkSession, tmp_path: Path) -> None:
    items = delivered(("orders", NOW - MINUTE, NOW - MINUTE))
    foreign = delivered(("orders", NOW - MINUTE, NOW - MINUTE), instance_id="old")[0]
    foreign["bounds_ms"] = {"S": "0,100,1000"}
    stats = t.decode_stats(raw_export(spark, str(tmp_path), [*items, foreign]))

    assert [r.known_layout for r in rows(stats, "known_layout")] == [False, True]
    assert rows(t.stats_in_window(stats, 0, NOW).select("messages")) == [(1,)]


def test_empty_export_gives_empty_reports(spark: SparkSession, tmp_path: Path) -> None:
    stats = t.decode_stats(raw_export(spark, str(tmp_path), []))
    volume = t.volume_5min(stats)

    assert rows(t.summarize_lateness(stats)) == []
    assert rows(t.lateness_hourly(stats)) == []
    assert rows(volume) == []
    assert rows(t.volume_peak(volume)) == []
    assert [r.messages for r in rows(t.lateness_histogram(stats))] == [0] * t.BUCKETS


def test_other_item_kinds_are_not_statistics(spark: SparkSession, tmp_path: Path) -> None:
    items = [message_item("m1", due_ms=NOW, target="orders"), watermark_item(NOW // 1000)]
    assert rows(t.decode_stats(raw_export(spark, str(tmp_path), items))) == []
