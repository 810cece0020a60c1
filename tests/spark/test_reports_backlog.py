"""Backlog forecast transforms on a synthetic export: exact rows, window edges, overdue items."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from delayq_reports import transforms as t
from delayq_reports.synthetic_exports import cancel_item, message_item, watermark_item
from tests.spark.conftest import DAY, HOUR, MINUTE, NOW, delivered, raw_export, rows, ts

pytestmark = pytest.mark.spark

NOW_S = NOW // 1000
WATERMARK = NOW_S - 300  # the scheduler has handed everything due up to 5 minutes ago to SQS


def backlog_items() -> list[dict[str, dict[str, str]]]:
    return [
        message_item("a1", due_ms=NOW, target="orders", size=10),  # due exactly now: pending
        message_item("a2", due_ms=NOW + 30_000, target="orders", shard=1, size=20),
        message_item("a3", due_ms=NOW + 30_500, target="orders", shard=2, size=30),
        message_item("b1", due_ms=NOW + 30_200, target="alerts", shard=3, size=7),
        message_item("a4", due_ms=NOW + 2 * HOUR, target="orders", size=40),
        message_item("a5", due_ms=NOW + 7 * DAY - 1, target="orders", size=50),  # last ms in
        message_item("a6", due_ms=NOW + 7 * DAY, target="orders", size=60),  # first ms out
        message_item("c1", due_ms=NOW + HOUR, target="orders", size=999),  # cancelled
        message_item("p1", due_ms=NOW - 10 * MINUTE, target="orders"),  # scheduled, awaiting TTL
        message_item("p2", due_ms=NOW - MINUTE, target="alerts", shard=5, tenant="t-1"),
        message_item("p3", due_ms=NOW - 1, target="alerts"),
        cancel_item("c1", cancelled_ms=NOW - HOUR),
        cancel_item("ghost", cancelled_ms=NOW - HOUR),  # names nothing stored
        watermark_item(WATERMARK),
        *delivered(("orders", NOW - MINUTE, NOW - MINUTE)),  # statistics are not backlog
    ]


@pytest.fixture(scope="module")
def items(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> DataFrame:
    directory = tmp_path_factory.mktemp("backlog")
    return t.decode_items(raw_export(spark, str(directory), backlog_items())).cache()


@pytest.fixture(scope="module")
def messages(items: DataFrame) -> DataFrame:
    return t.live_messages(items).cache()


def test_decode_items_columns_and_a_message_row(items: DataFrame) -> None:
    assert items.columns == [
        "kind",
        "pk",
        "id",
        "topic",
        "tenant",
        "due_ms",
        "due_second",
        "size",
        "second",
    ]
    p2 = items.where("id = 'p2'").collect()
    due = NOW - MINUTE
    assert p2 == [("msg", f"{due // 1000}#5", "p2", "alerts", "t-1", due, due // 1000, 100, None)]


def test_kind_counts_ignore_statistics(items: DataFrame) -> None:
    assert rows(t.kind_counts(items), "kind") == [
        ("cancel", 2),
        ("msg", 11),
        ("watermark", 1),
    ]


def test_watermark(items: DataFrame) -> None:
    assert rows(t.watermark(items)) == [(WATERMARK,)]


def test_watermark_is_null_without_one(spark: SparkSession, tmp_path: Path) -> None:
    raw = raw_export(spark, str(tmp_path), [message_item("x", due_ms=NOW, target="orders")])
    assert rows(t.watermark(t.decode_items(raw))) == [(None,)]


def test_cancelled_messages_are_not_live(messages: DataFrame) -> None:
    assert messages.columns == list(t.MESSAGE_COLUMNS)
    ids = [r.id for r in rows(messages, "id")]
    assert ids == ["a1", "a2", "a3", "a4", "a5", "a6", "b1", "p1", "p2", "p3"]


def test_forecast_per_minute(messages: DataFrame) -> None:
    forecast = t.due_forecast(messages, NOW, 7, "minute")

    assert forecast.columns == ["topic", "period_start", "messages", "bytes"]
    assert rows(forecast, "topic", "period_start") == [
        ("alerts", ts(NOW), 1, 7),
        ("orders", ts(NOW), 3, 60),
        ("orders", ts(NOW + 2 * HOUR), 1, 40),
        ("orders", ts(NOW + 7 * DAY - MINUTE), 1, 50),
    ]


def test_forecast_per_hour(messages: DataFrame) -> None:
    hour_start = NOW - 20 * MINUTE
    assert rows(t.due_forecast(messages, NOW, 7, "hour"), "topic", "period_start") == [
        ("alerts", ts(hour_start), 1, 7),
        ("orders", ts(hour_start), 3, 60),
        ("orders", ts(hour_start + 2 * HOUR), 1, 40),
        ("orders", ts(hour_start + 7 * DAY), 1, 50),
    ]


def test_forecast_per_day_in_utc_days(messages: DataFrame) -> None:
    day_start = NOW - (21 * HOUR + 20 * MINUTE)  # 2025-02-19 00:00 UTC
    assert rows(t.due_forecast(messages, NOW, 7, "day"), "topic", "period_start") == [
        ("alerts", ts(day_start), 1, 7),
        ("orders", ts(day_start), 4, 100),
        ("orders", ts(day_start + 7 * DAY), 1, 50),
    ]


def test_forecast_window_is_configurable(messages: DataFrame) -> None:
    forecast = t.due_forecast(messages, NOW, 1, "day")
    assert [r.messages for r in rows(forecast, "topic")] == [1, 4]


def test_largest_same_second_cohorts(messages: DataFrame) -> None:
    top = t.cohorts(messages, NOW, 2)

    assert top.columns == ["due_second", "due_at", "messages", "bytes", "topics"]
    assert top.collect() == [
        (NOW_S + 30, ts(NOW + 30_000), 3, 57, "alerts,orders"),
        (NOW_S, ts(NOW), 1, 10, "orders"),  # ties of one: the earliest second
    ]


def test_overdue_items_above_the_watermark(messages: DataFrame) -> None:
    overdue = t.overdue_items(messages, NOW, WATERMARK)

    assert overdue.columns == ["pk", "id", "topic", "tenant", "due_at", "due_ms", "overdue_ms"]
    p2, p3 = NOW - MINUTE, NOW - 1
    assert rows(overdue, "due_ms") == [
        (f"{p2 // 1000}#5", "p2", "alerts", "t-1", ts(p2), p2, MINUTE),
        (f"{p3 // 1000}#0", "p3", "alerts", None, ts(p3), p3, 1),
    ]


def test_without_a_watermark_every_past_due_item_is_overdue(messages: DataFrame) -> None:
    overdue = t.overdue_items(messages, NOW, None)
    assert [(r.id, r.overdue_ms) for r in rows(overdue, "due_ms")] == [
        ("p1", 10 * MINUTE),
        ("p2", MINUTE),
        ("p3", 1),
    ]


def test_backlog_by_topic(messages: DataFrame) -> None:
    backlog = t.backlog_by_topic(messages, NOW, 7, WATERMARK)

    assert rows(backlog, "topic") == [
        ("alerts", 1, 1, 2, 0, 7, ts(NOW + 30_200), ts(NOW - MINUTE)),
        ("orders", 6, 5, 0, 1, 210, ts(NOW), None),
    ]
    assert backlog.columns == [
        "topic",
        "pending",
        "due_in_window",
        "overdue",
        "scheduled_past_due",
        "bytes_pending",
        "next_due_at",
        "oldest_overdue_at",
    ]


def test_one_topic_only(spark: SparkSession, tmp_path: Path) -> None:
    raw = raw_export(
        spark,
        str(tmp_path),
        [message_item(f"m{i}", due_ms=NOW + i * HOUR, target="orders", size=1) for i in range(3)],
    )
    messages = t.live_messages(t.decode_items(raw))

    assert rows(t.backlog_by_topic(messages, NOW, 7, None)) == [
        ("orders", 3, 3, 0, 0, 3, ts(NOW), None)
    ]
    assert [r.messages for r in rows(t.due_forecast(messages, NOW, 7, "hour"), "period_start")] == [
        1,
        1,
        1,
    ]


def test_empty_export_gives_empty_forecasts(spark: SparkSession, tmp_path: Path) -> None:
    items = t.decode_items(raw_export(spark, str(tmp_path), []))
    messages = t.live_messages(items)

    assert rows(t.watermark(items)) == [(None,)]
    assert rows(t.backlog_by_topic(messages, NOW, 7, None)) == []
    assert rows(t.due_forecast(messages, NOW, 7, "minute")) == []
    assert rows(t.cohorts(messages, NOW, 20)) == []
    assert rows(t.overdue_items(messages, NOW, None)) == []
