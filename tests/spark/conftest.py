"""One local SparkSession for every Spark test, and helpers for synthetic exports."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, Row, SparkSession

from delayq import stats
from delayq_reports.io import LocalStore, locate_export, read_export
from delayq_reports.local_spark import build_session
from delayq_reports.synthetic_exports import Item, write_export

# 2025-02-19 21:20:00 UTC: a whole hour plus 20 minutes, so hour and day buckets are visible.
NOW = 1_740_000_000_000
MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The session the whole Spark tier shares (local[2], 2 shuffle partitions, no UI)."""
    session = build_session("delayq-reports-tests", shuffle_partitions=2)
    yield session
    session.stop()


def rows(df: DataFrame, *order: str) -> list[Row]:
    """The rows of `df`, sorted by `order` when given. Rows compare equal to plain tuples."""
    return df.orderBy(*order).collect() if order else df.collect()


def ts(epoch_ms: int) -> datetime:
    """A timestamp as PySpark returns it: naive, in the local time zone."""
    return datetime.fromtimestamp(epoch_ms / 1000)


def raw_export(spark: SparkSession, directory: str, items: Sequence[Item]) -> DataFrame:
    """Write `items` as an export under `directory` and read it back as the jobs do."""
    root = write_export(directory, items, export_time_ms=NOW)
    store = LocalStore()
    return read_export(spark, store, locate_export(store, str(root)))


def delivered(*deliveries: tuple[str, int, int], instance_id: str = "i-1") -> list[stats.Item]:
    """Statistics items, as the emitter writes them, for (topic, due_ms, emitted_ms) deliveries."""
    acc = stats.DeliveryStats(instance_id=instance_id)
    for target, due_ms, emitted_ms in deliveries:
        acc.add(target, due_ms, emitted_ms)
    return acc.flush_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), the Spark tier runs on one worker: one JVM and one
    session instead of one per worker."""
    spark_tier = Path(__file__).parent
    for item in items:
        if spark_tier in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("spark"))
