"""The two report jobs end to end: locate and read the export, transform, write the outputs.

The Glue entry points and the local runner both call `run_delivery_report` and
`run_backlog_forecast` with a SparkSession and the options. Each job writes under its own
`output_path` (the local runner uses ``<output>/delivery/`` and ``<output>/backlog/``)::

    index.html                       the summary: key figures, links, charts
    charts/<name>.png
    parquet/<table>/part-*.parquet
    csv/<table>/part-*.csv           with a header line

Each job reads the export once and caches the decoded rows it needs (a few narrow columns)
and the small aggregates that are both written and charted. Both set the session's time zone
to UTC, so that CSV timestamps are UTC wherever the job runs.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F  # noqa: N812 -- PySpark's convention (palantir guide)

from delayq_reports import render
from delayq_reports import transforms as t
from delayq_reports.io import (
    Export,
    Store,
    TableOutput,
    join,
    locate_export,
    read_export,
    relative_to,
    store_for,
    write_table,
)
from delayq_reports.options import BacklogForecastOptions, DeliveryReportOptions

DELIVERY: Final = "delivery"
EARLY_FACT: Final = "Early deliveries"
BACKLOG: Final = "backlog"
Clock = Callable[[], float]


@dataclass(frozen=True)
class ReportResult:
    """What a job wrote and the figures its summary shows."""

    name: str
    root: str
    index: str
    now_ms: int
    export: Export
    tables: tuple[TableOutput, ...]
    charts: tuple[str, ...]
    facts: tuple[tuple[str, str], ...]
    alerts: tuple[str, ...] = ()  # the facts the summary shows in red


def resolve_now_ms(now_ms: int | None, export: Export, clock: Clock = time.time) -> int:
    """The report's reference time: the option, else the export's time, else the clock."""
    if now_ms is not None:
        return now_ms
    if export.export_time_ms is not None:
        return export.export_time_ms
    return int(clock() * 1000)


def run_delivery_report(
    spark: SparkSession,
    options: DeliveryReportOptions,
    *,
    s3_client: Any = None,
    clock: Clock = time.time,
) -> ReportResult:
    """Lateness shares, percentiles and histogram, early deliveries and volume over the last
    `days`."""
    source = store_for(options.export_path, s3_client)
    sink = store_for(options.output_path, s3_client)
    export = locate_export(source, options.export_path)
    now_ms = resolve_now_ms(options.now_ms, export, clock)
    start_ms = now_ms - options.days * t.DAY_MS
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    with _cache_scope() as keep:
        stats = keep(t.decode_stats(read_export(spark, source, export)))
        usable = t.stats_in_window(stats, start_ms, now_ms)
        overall = keep(t.summarize_lateness(usable))
        by_topic = keep(t.summarize_lateness(usable, "topic"))
        hourly = keep(t.lateness_hourly(usable))
        histogram = keep(t.lateness_histogram(usable))
        volume = keep(t.volume_5min(usable))
        peak = keep(t.volume_peak(volume))
        root = options.output_path.rstrip("/")
        tables = (
            write_table(sink, overall, root, "lateness_overall", ()),
            write_table(sink, by_topic, root, "lateness_by_topic", ("topic",)),
            write_table(sink, hourly, root, "lateness_hourly", ("topic", "hour")),
            write_table(sink, histogram, root, "lateness_histogram", ("bucket",)),
            write_table(sink, volume, root, "volume_5min", ("window_start", "topic")),
            write_table(sink, peak, root, "volume_peak", ()),
        )
        overall_row = overall.first()
        topic_rows = by_topic.orderBy("topic").collect()
        peak_row = peak.first()
        skipped = stats.where(~F.col("known_layout")).count()
        early = 0 if overall_row is None else overall_row["early"]
        charts = {
            "lateness_histogram.png": _histogram_chart(
                histogram.collect(), early, options.lateness_p99_alarm_ms
            ),
            "lateness_hourly.png": _lateness_chart(hourly.collect()),
            "within_share.png": _within_chart(overall_row, topic_rows),
            "volume_5min.png": _volume_chart(volume.collect(), peak_row),
        }
    facts = (
        *_export_facts(export, now_ms),
        ("Window", f"{render.format_ms(start_ms)} to {render.format_ms(now_ms)}"),
        *_lateness_facts(overall_row),
        ("Peak 5 minutes", _peak_fact(peak_row)),
        ("Statistics rows skipped (unknown histogram layout)", str(skipped)),
    )
    return _publish(
        sink,
        name=DELIVERY,
        title="Delivery report",
        root=root,
        now_ms=now_ms,
        export=export,
        tables=tables,
        charts=charts,
        facts=facts,
        alerts=(EARLY_FACT,) if early else (),
    )


def run_backlog_forecast(
    spark: SparkSession,
    options: BacklogForecastOptions,
    *,
    s3_client: Any = None,
    clock: Clock = time.time,
) -> ReportResult:
    """What is due per minute, hour and day ahead, the coming bursts and the overdue items."""
    source = store_for(options.export_path, s3_client)
    sink = store_for(options.output_path, s3_client)
    export = locate_export(source, options.export_path)
    now_ms = resolve_now_ms(options.now_ms, export, clock)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    with _cache_scope() as keep:
        items = keep(t.decode_items(read_export(spark, source, export)))
        messages = keep(t.live_messages(items))
        mark = t.watermark(items).first()
        watermark_second = None if mark is None else mark["second"]
        kinds = {row["kind"]: row["items"] for row in t.kind_counts(items).collect()}
        by_topic = keep(t.backlog_by_topic(messages, now_ms, options.days, watermark_second))
        forecasts = {
            grain: t.due_forecast(messages, now_ms, options.days, grain)
            for grain in ("minute", "hour", "day")
        }
        hourly, daily = keep(forecasts["hour"]), keep(forecasts["day"])  # charted too
        top = keep(t.cohorts(messages, now_ms, options.top_cohorts))
        overdue = t.overdue_items(messages, now_ms, watermark_second)
        root = options.output_path.rstrip("/")
        order = ("topic", "period_start")
        tables = (
            write_table(sink, by_topic, root, "backlog_by_topic", ("topic",)),
            write_table(sink, forecasts["minute"], root, "forecast_minute", order),
            write_table(sink, hourly, root, "forecast_hour", order),
            write_table(sink, daily, root, "forecast_day", order),
            write_table(sink, top, root, "cohorts", (F.col("messages").desc(), "due_second")),
            write_table(sink, overdue, root, "overdue_items", ("due_ms", "id")),
        )
        topic_rows = by_topic.collect()
        top_rows = top.orderBy(F.col("messages").desc(), "due_second").collect()
        charts = {
            "forecast_hourly.png": _forecast_hourly_chart(hourly.collect()),
            "forecast_daily.png": _forecast_daily_chart(daily.collect()),
            "cohorts.png": _cohorts_chart(top_rows),
        }
    facts = (
        *_export_facts(export, now_ms),
        ("Scheduler watermark", _watermark_fact(watermark_second)),
        ("Items read", ", ".join(f"{k} {v:,}" for k, v in sorted(kinds.items())) or "none"),
        *_backlog_facts(topic_rows, options.days),
        ("Largest cohort", _cohort_fact(top_rows[0] if top_rows else None)),
    )
    return _publish(
        sink,
        name=BACKLOG,
        title="Backlog forecast",
        root=root,
        now_ms=now_ms,
        export=export,
        tables=tables,
        charts=charts,
        facts=facts,
    )


@contextmanager
def _cache_scope() -> Iterator[Callable[[DataFrame], DataFrame]]:
    """`keep(df)` caches a DataFrame that several outputs reuse; all are released on exit."""
    kept: list[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        kept.append(df.cache())
        return kept[-1]

    try:
        yield keep
    finally:
        for df in reversed(kept):
            df.unpersist()


def _publish(
    sink: Store,
    *,
    name: str,
    title: str,
    root: str,
    now_ms: int,
    export: Export,
    tables: Sequence[TableOutput],
    charts: dict[str, bytes],
    facts: Sequence[tuple[str, str]],
    alerts: Sequence[str] = (),
) -> ReportResult:
    chart_paths = []
    for file_name, png in charts.items():
        path = join(root, "charts", file_name)
        sink.write_bytes(path, png, "image/png")
        chart_paths.append(path)
    page = render.summary_html(
        title,
        facts,
        tables=[
            render.TableLinks(
                table.name, relative_to(root, table.csv), relative_to(root, table.parquet) + "/"
            )
            for table in tables
        ],
        charts=[
            render.Link(file_name.removesuffix(".png").replace("_", " "), relative_to(root, path))
            for file_name, path in zip(charts, chart_paths, strict=True)
        ],
        alerts=alerts,
    )
    index = join(root, "index.html")
    sink.write_bytes(index, page.encode("utf-8"), "text/html; charset=utf-8")
    return ReportResult(
        name,
        root,
        index,
        now_ms,
        export,
        tuple(tables),
        tuple(chart_paths),
        tuple(facts),
        tuple(alerts),
    )


def _export_facts(export: Export, now_ms: int) -> tuple[tuple[str, str], ...]:
    count = "unknown (no manifest)" if export.item_count is None else f"{export.item_count:,}"
    return (
        ("Export", f"{export.export_id} ({len(export.data_files)} data files, {count} items)"),
        ("Export time", render.format_ms(export.export_time_ms)),
        ("Reference time (now)", render.format_ms(now_ms)),
    )


def _lateness_facts(row: Row | None) -> tuple[tuple[str, str], ...]:
    if row is None:
        return (("Messages delivered", "0"),)
    return (
        ("Messages delivered", f"{row['messages']:,}"),
        (
            "Within 500 ms / 1 s / 2 s of due",
            " / ".join(render.format_share(row[name]) for name in t.WITHIN_MS),
        ),
        (EARLY_FACT, f"{row['early']:,}"),
        ("Lateness p50 / p99 / max", f"{row['p50_ms']} / {row['p99_ms']} / {row['max_ms']} ms"),
    )


def _peak_fact(row: Row | None) -> str:
    if row is None:
        return "—"
    return (
        f"{render.format_time(row['window_start'])}: {row['messages']:,} messages "
        f"({row['per_second']:,.1f}/s)"
    )


def _watermark_fact(second: int | None) -> str:
    return "none in the export" if second is None else render.format_ms(second * 1000)


def _backlog_facts(rows: Sequence[Row], days: int) -> tuple[tuple[str, str], ...]:
    def total(column: str) -> int:
        return sum(row[column] for row in rows)

    oldest = min(
        (row["oldest_overdue_at"] for row in rows if row["oldest_overdue_at"]), default=None
    )
    return (
        ("Pending messages", f"{total('pending'):,} ({total('bytes_pending'):,} bytes)"),
        (f"Due in the next {days} days", f"{total('due_in_window'):,}"),
        ("Overdue (past due, not handed to SQS)", f"{total('overdue'):,}"),
        ("Oldest overdue", render.format_time(oldest)),
        ("Past due, handed to SQS, awaiting TTL", f"{total('scheduled_past_due'):,}"),
    )


def _cohort_fact(row: Row | None) -> str:
    if row is None:
        return "—"
    return f"{render.format_time(row['due_at'])}: {row['messages']:,} messages ({row['topics']})"


def histogram_buckets(rows: Sequence[Row], early: int) -> list[render.Bucket]:
    """The bars of the lateness histogram: the early deliveries (an alert), those exactly on
    time (bucket 0 holds both), then one bar per bucket of `transforms.BOUNDS_MS`."""
    counts = {row["bucket"]: float(row["messages"]) for row in rows}
    bars = [
        render.Bucket("early (< 0)", float(early), alert=True),
        render.Bucket("0 (on time)", counts.get(0, 0.0) - early),
    ]
    labels = [f"≤ {bound:,}" for bound in t.BOUNDS_MS[1:]] + [f"> {t.BOUNDS_MS[-1]:,}"]
    bars += [render.Bucket(label, counts.get(i, 0.0)) for i, label in enumerate(labels, 1)]
    return bars


def threshold_position(threshold_ms: int) -> float:
    """Where `threshold_ms` falls on the histogram's axis (bar ``i`` centred on ``i``, as in
    `histogram_buckets`): at the right edge of the bucket whose upper bound it is, else
    interpolated within its bucket; above the last bound, at the overflow bar's left edge."""
    bucket = bisect_left(t.BOUNDS_MS, threshold_ms)
    bar = bucket + 1  # the early bar comes first
    if bucket >= len(t.BOUNDS_MS):
        return bar - 0.5
    if bucket == 0:
        return bar + 0.5
    lower, upper = t.BOUNDS_MS[bucket - 1], t.BOUNDS_MS[bucket]
    return bar - 0.5 + (threshold_ms - lower) / (upper - lower)


def _histogram_chart(rows: Sequence[Row], early: int, threshold_ms: int) -> bytes:
    return render.histogram_chart(
        "Lateness histogram, all topics",
        "lateness (ms after due)",
        histogram_buckets(rows, early),
        marker=render.Marker(
            threshold_position(threshold_ms), f"p99 lateness alarm: {threshold_ms:,} ms"
        ),
    )


def _lateness_chart(rows: Sequence[Row]) -> bytes:
    series: dict[str, list[render.Point]] = defaultdict(list)
    for row in rows:
        series[f"{row['topic']} p99"].append((row["hour"], row["p99_ms"]))
        series[f"{row['topic']} p50"].append((row["hour"], row["p50_ms"]))
    return render.line_chart("Lateness per hour (ms)", "ms late", series, log_y=True)


def _within_chart(overall: Row | None, topics: Sequence[Row]) -> bytes:
    rows = [("all topics", overall)] if overall is not None else []
    rows += [(row["topic"], row) for row in topics]
    labels = {"within_500ms": "<= 500 ms", "within_1s": "<= 1 s", "within_2s": "<= 2 s"}
    series = {label: [row[name] * 100 for _, row in rows] for name, label in labels.items()}
    return render.bar_chart(
        "Share of messages delivered within X of due", "%", [name for name, _ in rows], series
    )


def _volume_chart(rows: Sequence[Row], peak: Row | None) -> bytes:
    totals: dict[datetime, float] = defaultdict(float)
    for row in rows:
        totals[row["window_start"]] += row["messages"]
    mark = None if peak is None else (peak["window_start"], float(peak["messages"]))
    return render.line_chart(
        "Messages delivered per 5 minutes",
        "messages",
        {"all topics": list(totals.items())},
        mark=mark,
        step=timedelta(minutes=t.VOLUME_WINDOW_MINUTES),
    )


def _forecast_hourly_chart(rows: Sequence[Row]) -> bytes:
    series: dict[str, list[render.Point]] = defaultdict(list)
    for row in rows:
        series[row["topic"]].append((row["period_start"], row["messages"]))
    return render.line_chart("Messages due per hour", "messages", series)


def _forecast_daily_chart(rows: Sequence[Row]) -> bytes:
    days = sorted({row["period_start"] for row in rows})
    topics = sorted({row["topic"] for row in rows})
    counts = {(row["topic"], row["period_start"]): row["messages"] for row in rows}
    series = {topic: [float(counts.get((topic, day), 0)) for day in days] for topic in topics}
    labels = [render.utc(day).strftime("%Y-%m-%d") for day in days]
    return render.bar_chart("Messages due per day (UTC)", "messages", labels, series, stacked=True)


def _cohorts_chart(rows: Sequence[Row]) -> bytes:
    labels = [render.format_time(row["due_at"]).removesuffix(" UTC") for row in rows]
    series = {"messages": [float(row["messages"]) for row in rows]}
    return render.bar_chart("Largest same-second cohorts to come", "messages", labels, series)
