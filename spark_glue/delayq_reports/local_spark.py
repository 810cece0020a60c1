"""Run both reports on this machine: a small local SparkSession, no Glue, no cluster.

`run_reports` is what ``delayq report`` calls after exporting the local stack's table. The
export may be local or on S3 (moto, LocalStack or AWS, chosen by the boto3 client: boto3 honours
``AWS_ENDPOINT_URL``); an S3 export is copied to a temporary directory first, because local
Spark has no S3 file system. Outputs go to a local directory: ``delivery/`` and ``backlog/``
under it, and an ``index.html`` that links both summaries.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import boto3
from pyspark.sql import SparkSession

from delayq_reports import render
from delayq_reports.exceptions import ReportError
from delayq_reports.io import (
    LocalStore,
    S3Store,
    is_s3,
    join,
    locate_export,
    relative_to,
    stage_export,
)
from delayq_reports.jobs import (
    BACKLOG,
    DELIVERY,
    Clock,
    ReportResult,
    resolve_now_ms,
    run_backlog_forecast,
    run_delivery_report,
)
from delayq_reports.options import BacklogForecastOptions, DeliveryReportOptions

LOCAL_MASTER = "local[2]"
LOCAL_SHUFFLE_PARTITIONS = 4


@dataclass(frozen=True)
class LocalReports:
    """Both reports and the page that links them."""

    index: str
    delivery: ReportResult
    backlog: ReportResult


def build_session(
    app_name: str = "delayq-reports",
    *,
    master: str = LOCAL_MASTER,
    shuffle_partitions: int = LOCAL_SHUFFLE_PARTITIONS,
    driver_memory: str = "1g",
) -> SparkSession:
    """A local SparkSession sized for a shared 2-core machine: no UI, loopback only, UTC."""
    # The launcher reads this before the JVM starts; it keeps Spark off the network interfaces.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config(
            "spark.sql.warehouse.dir", os.path.join(tempfile.gettempdir(), "delayq-spark-warehouse")
        )
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def run_reports(
    export_path: str,
    output_path: str,
    now_ms: int | None = None,
    *,
    spark: SparkSession | None = None,
    s3_client: Any = None,
    clock: Clock = time.time,
) -> LocalReports:
    """Run the delivery report and the backlog forecast on the export at `export_path`.

    `now_ms` defaults to the export's time (manifest), else the clock. A session passed in is
    left running; one built here is stopped at the end. Returns where everything was written;
    ``<output_path>/index.html`` links both summaries.
    """
    if is_s3(output_path):
        raise ReportError("local runs write to a local directory, not to S3")
    session = spark or build_session()
    try:
        with tempfile.TemporaryDirectory(prefix="delayq-export-") as staging:
            local_export = export_path
            if is_s3(export_path):
                source = S3Store(s3_client or boto3.client("s3"))
                staged = stage_export(source, locate_export(source, export_path), staging)
                local_export = staged.root
            now = resolve_now_ms(now_ms, locate_export(LocalStore(), local_export), clock)
            delivery = run_delivery_report(
                session, DeliveryReportOptions(local_export, join(output_path, DELIVERY), now)
            )
            backlog = run_backlog_forecast(
                session, BacklogForecastOptions(local_export, join(output_path, BACKLOG), now)
            )
    finally:
        if spark is None:
            session.stop()
    index = join(output_path, "index.html")
    page = render.summary_html(
        "Kafka delay queue reports",
        (("Reference time (now)", render.format_ms(now)), ("Export", delivery.export.export_id)),
        links=[
            render.Link(result.name, relative_to(output_path, result.index))
            for result in (delivery, backlog)
        ],
    )
    LocalStore().write_bytes(index, page.encode("utf-8"), "text/html; charset=utf-8")
    return LocalReports(index, delivery, backlog)
