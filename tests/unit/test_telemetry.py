"""Telemetry: the metrics (EMF through Powertools) and log lines of each service's result."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from delayq import telemetry
from delayq.cleanup import Outcome
from delayq.emitter import EmitResult
from delayq.ingest import IngestResult
from delayq.producing import Delivery
from delayq.records import Reason, Rejection
from delayq.scheduler import ScheduleResult
from delayq.settings import Settings
from testkit.clock import NOW_MS
from tests.factories import ROOT

NAMESPACE = "DelayQueueTest"
# Settings whose delivery log is off (the existing tests look at the other lines).
QUIET = Settings(allowed_targets=("orders.*", "reminders"), delivery_log_rate=0.0)


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    # Powertools keeps one metric set per process: start and leave it empty.
    m = Metrics(namespace=NAMESPACE, service="delayq-test")
    m.clear_metrics()
    yield m
    m.clear_metrics()


@pytest.fixture
def log_stream() -> io.StringIO:
    return io.StringIO()


@pytest.fixture
def logger(log_stream: io.StringIO) -> Logger:
    # A fresh service name: Powertools configures one logging.Logger per service only once.
    return Logger(service=f"delayq-test-{uuid.uuid4().hex}", stream=log_stream)


def emitted(metrics: Metrics) -> dict[str, tuple[str, list[float]]]:
    """Metric name -> (unit, values) from the EMF blob Powertools would print."""
    blob: dict[str, Any] = dict(metrics.serialize_metric_set())
    (directive,) = blob["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == NAMESPACE
    return {m["Name"]: (m["Unit"], blob[m["Name"]]) for m in directive["Metrics"]}


def log_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


# --- ingest ------------------------------------------------------------------------------------


def ingest_result() -> IngestResult:
    return IngestResult(
        queued=5,
        stored=7,
        cancelled=1,
        rescheduled=9,
        offloaded=2,
        rescued=3,
        rejected=[
            Rejection(Reason.BAD_DUE, "delay-seconds='x' is not a number", {}, "in", 1, 42),
            Rejection(Reason.MALFORMED_RECORD, "record is not an object", "junk", None, None, None),
        ],
        capped=4,
        deferred=6,
        direct_fallback=8,
    )


def test_report_ingest_returns_the_counts(metrics: Metrics, logger: Logger) -> None:
    assert telemetry.report_ingest(metrics, logger, ingest_result(), QUIET) == {
        "queued": 5,
        "stored": 7,
        "cancelled": 1,
        "rescheduled": 9,
        "offloaded": 2,
        "rescued": 3,
        "rejected": 2,
        "direct": 0,
        "fallback": 8,
        "capped": 4,
        "deferred": 6,
    }


def test_report_ingest_emits_one_count_metric_per_outcome(metrics: Metrics, logger: Logger) -> None:
    telemetry.report_ingest(metrics, logger, ingest_result(), QUIET)
    assert emitted(metrics) == {
        "IngestQueued": ("Count", [5.0]),
        "IngestStored": ("Count", [7.0]),
        "IngestCancelled": ("Count", [1.0]),
        "IngestRescheduled": ("Count", [9.0]),
        "IngestOffloaded": ("Count", [2.0]),
        "IngestRescued": ("Count", [3.0]),
        "IngestRejected": ("Count", [2.0]),
        "IngestDirect": ("Count", [0.0]),
        "IngestFallback": ("Count", [8.0]),
        "IngestCapped": ("Count", [4.0]),
        "IngestDeferred": ("Count", [6.0]),
    }


def test_report_ingest_logs_each_rejection_with_its_reason_and_coordinates(
    metrics: Metrics, logger: Logger, log_stream: io.StringIO
) -> None:
    telemetry.report_ingest(metrics, logger, ingest_result(), QUIET)
    lines = log_lines(log_stream)
    assert [
        (x["level"], x["message"], x["reason"], x.get("topic"), x.get("partition"), x.get("offset"))
        for x in lines
    ] == [
        ("WARNING", "record rejected", "bad-due", "in", 1, 42),
        # Powertools leaves out keys whose value is None: unknown coordinates are absent.
        ("WARNING", "record rejected", "malformed-record", None, None, None),
    ]
    assert lines[0]["detail"] == "delay-seconds='x' is not a number"


def test_report_ingest_of_a_clean_batch_logs_nothing(
    metrics: Metrics, logger: Logger, log_stream: io.StringIO
) -> None:
    telemetry.report_ingest(metrics, logger, IngestResult(queued=1), QUIET)
    assert log_stream.getvalue() == ""


# --- scheduler ---------------------------------------------------------------------------------


def schedule_result(**overrides: Any) -> ScheduleResult:
    values: dict[str, Any] = {
        "watermark_before": 1000,
        "watermark_after": 1830,
        "seconds_scanned": 830,
        "sent": 12,
        "checkpoints": 2,
        "target_second": 1840,
    }
    values.update(overrides)
    return ScheduleResult(**values)


def test_report_schedule_emits_sent_scanned_checkpoints_and_lag(
    metrics: Metrics, logger: Logger
) -> None:
    telemetry.report_schedule(metrics, logger, schedule_result())
    assert emitted(metrics) == {
        "SchedulerSent": ("Count", [12.0]),
        "SchedulerSecondsScanned": ("Count", [830.0]),
        "SchedulerCheckpoints": ("Count", [2.0]),
        "WatermarkLagSeconds": ("Seconds", [10.0]),
    }


def test_report_schedule_lag_is_zero_once_caught_up(metrics: Metrics, logger: Logger) -> None:
    telemetry.report_schedule(metrics, logger, schedule_result(watermark_after=1840))
    assert emitted(metrics)["WatermarkLagSeconds"] == ("Seconds", [0.0])


def test_report_schedule_returns_the_run_summary(metrics: Metrics, logger: Logger) -> None:
    assert telemetry.report_schedule(metrics, logger, schedule_result()) == {
        "watermark_before": 1000,
        "watermark_after": 1830,
        "seconds_scanned": 830,
        "sent": 12,
        "checkpoints": 2,
        "stopped_early": False,
        "conflict": False,
    }


def test_a_finished_scheduler_run_is_logged_as_info(
    metrics: Metrics, logger: Logger, log_stream: io.StringIO
) -> None:
    telemetry.report_schedule(metrics, logger, schedule_result())
    (line,) = log_lines(log_stream)
    assert (line["level"], line["message"], line["sent"]) == ("INFO", "scheduler run", 12)


@pytest.mark.parametrize("flag", ["stopped_early", "conflict"])
def test_an_unfinished_scheduler_run_is_logged_as_a_warning(
    metrics: Metrics, logger: Logger, log_stream: io.StringIO, flag: str
) -> None:
    telemetry.report_schedule(metrics, logger, schedule_result(**{flag: True}))
    (line,) = log_lines(log_stream)
    assert (line["level"], line["message"], line[flag]) == (
        "WARNING",
        "scheduler did not finish its window",
        True,
    )


# --- emitter -----------------------------------------------------------------------------------


def emit_result() -> EmitResult:
    return EmitResult(
        failed=["m-3", "m-4"],
        deliveries=[
            Delivery("orders.a", NOW_MS, NOW_MS + 12),
            Delivery("orders.a", NOW_MS, NOW_MS),
            Delivery("reminders", NOW_MS, NOW_MS + 480),
        ],
        cancelled=1,
        redelayed=1,
        requeued=4,
        rejected=2,
        cap_held=5,
        errors=["order-3: kafka: timed out", "order-4: re-delay failed: x"],
    )


def test_report_emit_returns_the_failed_items_for_sqs(metrics: Metrics, logger: Logger) -> None:
    assert telemetry.report_emit(metrics, logger, emit_result(), QUIET) == {
        "batchItemFailures": [{"itemIdentifier": "m-3"}, {"itemIdentifier": "m-4"}]
    }


def test_report_emit_of_a_clean_batch_reports_no_failures(metrics: Metrics, logger: Logger) -> None:
    assert telemetry.report_emit(metrics, logger, EmitResult(), QUIET) == {"batchItemFailures": []}


def test_report_emit_emits_counts_and_one_lateness_value_per_delivery(
    metrics: Metrics, logger: Logger
) -> None:
    telemetry.report_emit(metrics, logger, emit_result(), QUIET)
    assert emitted(metrics) == {
        "Emitted": ("Count", [3.0]),
        "EmitCancelled": ("Count", [1.0]),
        "EmitRedelayed": ("Count", [1.0]),
        "EmitRequeued": ("Count", [4.0]),
        "EmitRejected": ("Count", [2.0]),
        "EmitFailed": ("Count", [2.0]),
        "CapHeld": ("Count", [5.0]),
        "LatenessMs": ("Milliseconds", [12.0, 0.0, 480.0]),
    }


def test_report_emit_logs_each_error(
    metrics: Metrics, logger: Logger, log_stream: io.StringIO
) -> None:
    telemetry.report_emit(metrics, logger, emit_result(), QUIET)
    assert [(x["level"], x["message"], x["error"]) for x in log_lines(log_stream)] == [
        ("ERROR", "emit problem", "order-3: kafka: timed out"),
        ("ERROR", "emit problem", "order-4: re-delay failed: x"),
    ]


# --- cleanup -----------------------------------------------------------------------------------


def test_report_cleanup_counts_redriven_and_cleaned(metrics: Metrics) -> None:
    outcomes = [Outcome.REDRIVEN, Outcome.IGNORED, Outcome.CLEANED, Outcome.REDRIVEN]
    telemetry.report_cleanup(metrics, outcomes)
    assert emitted(metrics) == {
        "RedrivenFromTtl": ("Count", [2.0]),
        "TtlCleaned": ("Count", [1.0]),
    }


def test_report_cleanup_of_nothing_reports_zeros(metrics: Metrics) -> None:
    telemetry.report_cleanup(metrics, [])
    assert emitted(metrics) == {"RedrivenFromTtl": ("Count", [0.0]), "TtlCleaned": ("Count", [0.0])}


# --- the operator's contract -------------------------------------------------------------------


def test_every_metric_the_template_alarms_on_is_emitted(metrics: Metrics, logger: Logger) -> None:
    template = (ROOT / "template.yaml").read_text()
    alarmed = set(re.findall(rf"Namespace: {telemetry.NAMESPACE}\s+MetricName: (\w+)", template))
    telemetry.report_ingest(metrics, logger, ingest_result(), QUIET)
    telemetry.report_schedule(metrics, logger, schedule_result())
    telemetry.report_emit(metrics, logger, emit_result(), QUIET)
    telemetry.report_cleanup(metrics, [])
    assert alarmed
    assert alarmed <= set(emitted(metrics))
    assert f"POWERTOOLS_METRICS_NAMESPACE: {telemetry.NAMESPACE}" in template


# --- per-target lateness and the delivery log ----------------------------------------------


def test_lateness_by_target_has_one_value_per_allow_list_entry(
    logger: Logger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    deliveries = [
        *emit_result().deliveries,
        Delivery("orders.b", NOW_MS, NOW_MS + 3),
        Delivery("stray", NOW_MS, NOW_MS + 7),  # allowed once, since removed from the list
    ]

    by_entry = telemetry.report_deliveries(logger, deliveries, QUIET)

    assert by_entry == {"orders.*": [12, 0, 3], "reminders": [480], "other": [7]}
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    published = {b["target"]: b["LatenessByTargetMs"] for b in blobs}
    assert published == {"orders.*": [12.0, 0.0, 3.0], "reminders": [480.0], "other": [7.0]}
    for blob in blobs:
        (directive,) = blob["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == telemetry.NAMESPACE
        assert any("target" in dimensions for dimensions in directive["Dimensions"])


def test_the_delivery_log_samples_by_id(
    logger: Logger, log_stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    deliveries = [Delivery("orders.a", NOW_MS, NOW_MS + 5, f"id-{i}", 2) for i in range(2000)]
    settings = Settings(allowed_targets=("orders.*",), delivery_log_rate=0.1)

    telemetry.report_deliveries(logger, deliveries, settings)
    telemetry.report_deliveries(logger, deliveries, settings)

    lines = [line for line in log_lines(log_stream) if line["message"] == "delivered"]
    ids = [line["delay_id"] for line in lines]
    assert 140 <= len(set(ids)) <= 260  # about 10 % of 2,000
    assert len(ids) == 2 * len(set(ids))  # the same ids both times: chosen by id
    first = lines[0]
    assert (first["target"], first["attempt"], first["lateness_ms"]) == ("orders.a", 2, 5)
    assert first["emitted_ms"] - first["due_ms"] == 5


@pytest.mark.parametrize(("rate", "expected"), [(0.0, False), (1.0, True)])
def test_a_delivery_log_rate_of_0_or_1_logs_none_or_all(rate: float, expected: bool) -> None:
    assert {telemetry.logged(f"x-{i}", rate) for i in range(100)} == {expected}


def test_the_delivery_log_rate_is_validated() -> None:
    with pytest.raises(Exception, match=r"delivery_log_rate must be 0\.\.1"):
        Settings(delivery_log_rate=1.5)
