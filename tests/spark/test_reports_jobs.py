"""Both jobs end to end: the local runner, the Glue entry points (awsglue stubbed), the zip."""

from __future__ import annotations

import gzip
import re
import runpy
import sys
import types
import zipfile
from collections.abc import Mapping
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from pyspark.sql import Row, SparkSession

from delayq import constants, stats
from delayq_reports import bench
from delayq_reports import transforms as t
from delayq_reports.exceptions import ReportError
from delayq_reports.io import Export, LocalStore, locate_export, read_export
from delayq_reports.jobs import histogram_buckets, resolve_now_ms, threshold_position
from delayq_reports.local_spark import LocalReports, run_reports
from delayq_reports.synthetic_exports import cancel_item, message_item, watermark_item, write_export
from tests.spark.conftest import HOUR, MINUTE, NOW, delivered

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "spark_glue" / "jobs"
PNG = b"\x89PNG\r\n\x1a\n"


def small_export(directory: Path) -> Path:
    items = [
        *delivered(
            ("orders", NOW - 30 * MINUTE, NOW - 30 * MINUTE + 120),
            ("orders", NOW - 30 * MINUTE, NOW - 30 * MINUTE + 2000),
            ("alerts", NOW - 10 * MINUTE, NOW - 10 * MINUTE + 40),
        ),
        message_item("m1", due_ms=NOW + HOUR, target="orders", size=10),
        message_item("m2", due_ms=NOW + HOUR, target="orders", shard=1, size=20),
        message_item("m3", due_ms=NOW + 2 * HOUR, target="alerts", size=30),
        message_item("late", due_ms=NOW - MINUTE, target="alerts", size=40),
        message_item("gone", due_ms=NOW + HOUR, target="orders", size=50),
        cancel_item("gone", cancelled_ms=NOW - HOUR),
        watermark_item(NOW // 1000 - 300),
    ]
    return write_export(directory, items, export_time_ms=NOW)


def links(page: Path) -> list[Path]:
    return [page.parent / href for href in re.findall(r'(?:href|src)="([^"]+)"', page.read_text())]


@pytest.fixture(scope="module")
def reports(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> LocalReports:
    base = tmp_path_factory.mktemp("run")
    small_export(base / "export")
    return run_reports(str(base / "export"), str(base / "out"), spark=spark)


@pytest.mark.spark
class TestRunReports:
    def test_the_index_links_both_summaries_and_everything_they_link_exists(
        self, reports: LocalReports
    ) -> None:
        index = Path(reports.index)
        summaries = links(index)

        assert summaries == [Path(reports.delivery.index), Path(reports.backlog.index)]
        for summary in summaries:
            targets = links(summary)
            assert targets, summary
            assert [p for p in targets if not p.exists()] == []

    def test_reference_time_defaults_to_the_export_time(self, reports: LocalReports) -> None:
        assert reports.delivery.now_ms == reports.backlog.now_ms == NOW

    def test_delivery_outputs(self, reports: LocalReports) -> None:
        tables = {table.name: Path(table.csv) for table in reports.delivery.tables}

        assert sorted(tables) == [
            "lateness_by_topic",
            "lateness_histogram",
            "lateness_hourly",
            "lateness_overall",
            "volume_5min",
            "volume_peak",
        ]
        assert tables["lateness_by_topic"].read_text().splitlines() == [
            "topic,messages,early,within_500ms,within_1s,within_2s,p50_ms,p99_ms,max_ms,mean_ms",
            "alerts,1,0,1.0,1.0,1.0,40,40,40,40.0",
            "orders,2,0,0.5,0.5,1.0,200,2000,2000,1060.0",
        ]
        facts = dict(reports.delivery.facts)
        assert facts["Messages delivered"] == "3"
        assert facts["Within 500 ms / 1 s / 2 s of due"] == "66.67 % / 66.67 % / 100.00 %"
        assert facts["Peak 5 minutes"] == "2025-02-19 20:50:00 UTC: 2 messages (0.0/s)"
        assert facts["Early deliveries"] == "0"
        assert reports.delivery.alerts == ()
        # 40 ms -> bucket 3 (25, 50]; 120 ms -> 5 (100, 200]; 2000 ms -> 12 (1500, 2000].
        histogram = tables["lateness_histogram"].read_text().splitlines()
        assert histogram[0] == "bucket,le_ms,messages"
        assert [line for line in histogram[1:] if not line.endswith(",0")] == [
            "3,50,1",
            "5,200,1",
            "12,2000,1",
        ]
        assert histogram[-1] == "18,,0"
        charts = [Path(p).name for p in reports.delivery.charts]
        assert charts[0] == "lateness_histogram.png"
        assert all(Path(p).read_bytes().startswith(PNG) for p in reports.delivery.charts)

    def test_backlog_outputs(self, reports: LocalReports) -> None:
        tables = {table.name: Path(table.csv) for table in reports.backlog.tables}

        assert sorted(tables) == [
            "backlog_by_topic",
            "cohorts",
            "forecast_day",
            "forecast_hour",
            "forecast_minute",
            "overdue_items",
        ]
        assert tables["backlog_by_topic"].read_text().splitlines() == [
            "topic,pending,due_in_window,overdue,scheduled_past_due,bytes_pending,"
            "next_due_at,oldest_overdue_at",
            "alerts,1,1,1,0,30,2025-02-19T23:20:00.000Z,2025-02-19T21:19:00.000Z",
            "orders,2,2,0,0,30,2025-02-19T22:20:00.000Z,",
        ]
        assert tables["cohorts"].read_text().splitlines()[1] == (
            "1740003600,2025-02-19T22:20:00.000Z,2,30,orders"
        )
        facts = dict(reports.backlog.facts)
        assert facts["Overdue (past due, not handed to SQS)"] == "1"
        assert facts["Items read"] == "cancel 1, msg 5, watermark 1"
        assert all(Path(p).read_bytes().startswith(PNG) for p in reports.backlog.charts)


@pytest.mark.spark
def test_an_empty_moto_export_on_s3_still_reports(spark: SparkSession, tmp_path: Path) -> None:
    """What moto writes for an empty table: one empty data/<uuid>.gz, no manifests, on S3."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="local-analytics")
        key = "exports/AWSDynamoDB/0a1b2c3d/data/c0ffee.gz"
        s3.put_object(Bucket="local-analytics", Key=key, Body=gzip.compress(b""))

        result = run_reports(
            "s3://local-analytics/exports", str(tmp_path / "out"), NOW, spark=spark, s3_client=s3
        )

    assert result.delivery.export.export_id == "0a1b2c3d"
    assert dict(result.delivery.facts)["Messages delivered"] == "0"
    assert dict(result.backlog.facts)["Pending messages"] == "0 (0 bytes)"
    overdue = next(x for x in result.backlog.tables if x.name == "overdue_items")
    assert Path(overdue.csv).read_text() == "pk,id,topic,tenant,due_at,due_ms,overdue_ms\n"


def test_local_runs_write_locally() -> None:
    with pytest.raises(ReportError, match="local directory"):
        run_reports("/tmp/export", "s3://analytics/reports")


@pytest.mark.parametrize(
    ("option", "export_time", "expected"),
    [(5, 7, 5), (None, 7, 7), (None, None, 9000)],
)
def test_now_is_the_option_then_the_export_time_then_the_clock(
    option: int | None, export_time: int | None, expected: int
) -> None:
    export = Export(root="/x", export_id="x", data_files=(), export_time_ms=export_time)
    assert resolve_now_ms(option, export, clock=lambda: 9.0) == expected


@pytest.mark.parametrize(
    ("threshold_ms", "position"),
    [
        (1000, 11.5),  # the bound of bar 11 (750, 1000]: between it and bar 12
        (1200, 11.9),  # 40 % into bar 12 (1000, 1500]
        (1, 1.6),  # 10 % into bar 2 (0, 10]
        (10, 2.5),
        (60000, 18.5),
        (90000, 18.5),  # beyond the last bound: where the overflow bar starts
    ],
)
def test_the_alarm_threshold_sits_where_its_lateness_falls(
    threshold_ms: int, position: float
) -> None:
    assert threshold_position(threshold_ms) == pytest.approx(position)


def test_histogram_bars_split_early_from_on_time() -> None:
    rows = [Row(bucket=0, messages=5), Row(bucket=10, messages=2), Row(bucket=18, messages=1)]

    bars = histogram_buckets(rows, early=3)

    assert [(b.label, b.count, b.alert) for b in bars[:3]] == [
        ("early (< 0)", 3.0, True),
        ("0 (on time)", 2.0, False),
        ("≤ 10", 0.0, False),
    ]
    assert (bars[11].label, bars[11].count) == ("≤ 1,000", 2.0)
    assert (bars[-1].label, bars[-1].count) == ("> 60,000", 1.0)
    assert len(bars) == t.BUCKETS + 1
    assert not any(b.alert for b in bars[1:])


class FakeGlue:
    """Stand-ins for the awsglue modules: a GlueContext over the test session and a
    getResolvedOptions that, like Glue's, fails on a name absent from argv."""

    def __init__(self, spark: SparkSession) -> None:
        self.requested: list[list[str]] = []
        self.spark = spark

    def modules(self) -> dict[str, types.ModuleType]:
        spark = self.spark
        context = types.ModuleType("awsglue.context")
        utils = types.ModuleType("awsglue.utils")

        class GlueContext:
            def __init__(self, spark_context: object) -> None:
                assert spark_context is spark.sparkContext
                self.spark_session = spark

        def get_resolved_options(argv: list[str], names: list[str]) -> Mapping[str, str]:
            self.requested.append(list(names))
            pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
            return {name: pairs[f"--{name}"] for name in names}

        context.GlueContext = GlueContext  # type: ignore[attr-defined]
        utils.getResolvedOptions = get_resolved_options  # type: ignore[attr-defined]
        return {
            "awsglue": types.ModuleType("awsglue"),
            "awsglue.context": context,
            "awsglue.utils": utils,
        }


def run_entry_point(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, directory: Path, argv: list[str]
) -> FakeGlue:
    """Run a job script as Glue would, with `argv` after the script name, awsglue stubbed."""
    small_export(directory / "export")
    glue = FakeGlue(spark)
    for name, module in glue.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    script = JOBS / argv[0]
    monkeypatch.setattr(sys, "argv", [str(script), "--JOB_NAME", "job", *argv[1:]])
    runpy.run_path(str(script), run_name="__main__")
    return glue


@pytest.mark.spark
def test_delivery_report_entry_point(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = ["delivery_report.py", "--export_path", str(tmp_path / "export")]
    argv += ["--output_path", str(tmp_path / "out"), "--days", "1"]

    glue = run_entry_point(spark, monkeypatch, tmp_path, argv)

    assert glue.requested == [["export_path", "output_path", "days"]]
    assert (tmp_path / "out" / "index.html").is_file()


@pytest.mark.spark
def test_backlog_forecast_entry_point(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = ["backlog_forecast.py", "--export_path", str(tmp_path / "export")]
    argv += ["--output_path", str(tmp_path / "out"), "--now_ms", str(NOW + HOUR)]

    glue = run_entry_point(spark, monkeypatch, tmp_path, argv)

    assert glue.requested == [["export_path", "output_path", "now_ms"]]
    facts = (tmp_path / "out" / "index.html").read_text()
    assert "2025-02-19 22:20:00.000 UTC" in facts  # the reference time came from --now_ms


@pytest.mark.spark
def test_the_benchmark_export_reads_as_the_jobs_expect(spark: SparkSession, tmp_path: Path) -> None:
    root = bench.generate(spark, tmp_path / "export", 2000, 2, 0.05)
    store = LocalStore()
    export = locate_export(store, str(tmp_path / "export"))
    raw = read_export(spark, store, export)

    assert (export.root, export.item_count, export.export_time_ms) == (str(root), 2000, NOW)
    kinds = {r.kind: r.items for r in t.kind_counts(t.decode_items(raw)).collect()}
    assert kinds == {"msg": 1898, "cancel": 1, "watermark": 1}
    stats_rows = t.decode_stats(raw)
    assert stats_rows.count() == 300  # 100 items x 3 topics
    assert stats_rows.where("known_layout").count() == 300


def test_glue_zip_holds_the_job_modules_only(tmp_path: Path) -> None:
    glue_zip = runpy.run_path(str(REPO / "spark_glue" / "glue_zip.py"))
    first, second = tmp_path / "a.zip", tmp_path / "b.zip"

    names = glue_zip["build"](first)
    glue_zip["build"](second)

    assert names == [
        f"delayq_reports/{m}.py"
        for m in (
            "__init__",
            "exceptions",
            "io",
            "jobs",
            "options",
            "render",
            "schema",
            "transforms",
        )
    ]
    assert zipfile.ZipFile(first).namelist() == names
    assert first.read_bytes() == second.read_bytes()


def test_the_reports_read_the_layout_the_emitter_writes() -> None:
    assert t.BOUNDS_MS == stats.BOUNDS_MS
    assert t.BOUNDS_ATTRIBUTE == stats.BOUNDS_ATTRIBUTE
    assert t.BUCKETS == stats.BUCKETS
    kinds = (t.KIND_MESSAGE, t.KIND_CANCEL, t.KIND_WATERMARK, t.KIND_STATS)
    assert kinds == (
        constants.KIND_MESSAGE,
        constants.KIND_CANCEL,
        constants.KIND_WATERMARK,
        constants.KIND_STATS,
    )
