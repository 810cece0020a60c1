"""Turns service results into CloudWatch metrics (EMF, via Powertools) and log lines.

Metric names are part of the operator's contract: the template's alarms use them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from delayq.cleanup import Outcome
from delayq.emitter import EmitResult
from delayq.ingest import IngestResult
from delayq.producing import Delivery
from delayq.scheduler import ScheduleResult
from delayq.settings import Settings, topic_allowed

__all__ = [
    "NAMESPACE",
    "logged",
    "report_cleanup",
    "report_deliveries",
    "report_emit",
    "report_ingest",
    "report_schedule",
]

NAMESPACE: Final = "KafkaDelayQueue"


def report_ingest(
    metrics: Metrics, logger: Logger, result: IngestResult, settings: Settings
) -> dict[str, Any]:
    """Metrics and logs for one ingest batch; returns the handler's summary."""
    summary = {
        "queued": result.queued,
        "stored": result.stored,
        "cancelled": result.cancelled,
        "rescheduled": result.rescheduled,
        "offloaded": result.offloaded,
        "rescued": result.rescued,
        "rejected": len(result.rejected),
        "direct": len(result.deliveries),
        "fallback": result.direct_fallback,
        "capped": result.capped,
        "deferred": result.deferred,
    }
    for name, value in summary.items():
        metrics.add_metric(name=f"Ingest{name.capitalize()}", unit=MetricUnit.Count, value=value)
    # Direct deliveries count like the emitter's: the lateness alarm and dashboard see both.
    _record_lateness(metrics, result.deliveries)
    report_deliveries(logger, result.deliveries, settings)
    for error in result.errors:
        logger.warning("direct path", error=error)
    for rejection in result.rejected:
        logger.warning(
            "record rejected",
            reason=str(rejection.reason),
            detail=rejection.detail,
            topic=rejection.topic,
            partition=rejection.partition,
            offset=rejection.offset,
        )
    return summary


def report_schedule(metrics: Metrics, logger: Logger, result: ScheduleResult) -> dict[str, Any]:
    """Metrics and logs for one scheduler run; returns the handler's summary."""
    metrics.add_metric(name="SchedulerSent", unit=MetricUnit.Count, value=result.sent)
    metrics.add_metric(
        name="SchedulerSecondsScanned", unit=MetricUnit.Count, value=result.seconds_scanned
    )
    metrics.add_metric(name="SchedulerCheckpoints", unit=MetricUnit.Count, value=result.checkpoints)
    metrics.add_metric(
        name="WatermarkLagSeconds", unit=MetricUnit.Seconds, value=result.lag_seconds
    )
    summary: dict[str, Any] = {
        "watermark_before": result.watermark_before,
        "watermark_after": result.watermark_after,
        "seconds_scanned": result.seconds_scanned,
        "sent": result.sent,
        "checkpoints": result.checkpoints,
        "stopped_early": result.stopped_early,
        "conflict": result.conflict,
    }
    if result.stopped_early or result.conflict:
        logger.warning("scheduler did not finish its window", extra=summary)
    else:
        logger.info("scheduler run", extra=summary)
    return summary


def report_emit(
    metrics: Metrics, logger: Logger, result: EmitResult, settings: Settings
) -> dict[str, Any]:
    """Metrics (lateness per message) and logs for one emitter batch; returns the response."""
    metrics.add_metric(name="Emitted", unit=MetricUnit.Count, value=len(result.deliveries))
    metrics.add_metric(name="EmitCancelled", unit=MetricUnit.Count, value=result.cancelled)
    metrics.add_metric(name="EmitRedelayed", unit=MetricUnit.Count, value=result.redelayed)
    metrics.add_metric(name="EmitRequeued", unit=MetricUnit.Count, value=result.requeued)
    metrics.add_metric(name="EmitRejected", unit=MetricUnit.Count, value=result.rejected)
    metrics.add_metric(name="EmitFailed", unit=MetricUnit.Count, value=len(result.failed))
    metrics.add_metric(name="CapHeld", unit=MetricUnit.Count, value=result.cap_held)
    _record_lateness(metrics, result.deliveries)
    report_deliveries(logger, result.deliveries, settings)
    for error in result.errors:
        logger.error("emit problem", error=error)
    return {"batchItemFailures": [{"itemIdentifier": i} for i in result.failed]}


def report_cleanup(metrics: Metrics, outcomes: list[Outcome]) -> None:
    """Count re-driven messages (each one is a scheduler outage that TTL caught)."""
    metrics.add_metric(
        name="RedrivenFromTtl",
        unit=MetricUnit.Count,
        value=sum(1 for o in outcomes if o is Outcome.REDRIVEN),
    )
    metrics.add_metric(
        name="TtlCleaned",
        unit=MetricUnit.Count,
        value=sum(1 for o in outcomes if o is Outcome.CLEANED),
    )


def _record_lateness(metrics: Metrics, deliveries: Sequence[Delivery]) -> None:
    """Lateness (from due, or from the release slot a cap gave) and, apart, the cap delay:
    a capped burst never reads as the pipeline being late."""
    for delivery in deliveries:
        metrics.add_metric(
            name="LatenessMs", unit=MetricUnit.Milliseconds, value=delivery.lateness_ms
        )
        if delivery.cap_delay_ms:
            metrics.add_metric(
                name="CapDelayMs", unit=MetricUnit.Milliseconds, value=delivery.cap_delay_ms
            )


def report_deliveries(
    logger: Logger, deliveries: Sequence[Delivery], settings: Settings
) -> dict[str, list[int]]:
    """Per-target lateness and the sampled delivery log of one batch; returns the lateness
    values by allow-list entry (what was published).

    `LatenessByTargetMs` has the dimension `target`: the `AllowedTargets` entry the topic
    matched (`orders.*`, or an exact name), so its number of values is bounded by the
    allow-list, whatever topics the patterns admit. One EMF line per entry and batch.
    """
    by_entry: dict[str, list[int]] = {}
    entry_of: dict[str, str] = {}  # a batch has few targets: match each once
    for delivery in deliveries:
        if delivery.target not in entry_of:
            entry_of[delivery.target] = next(
                (p for p in settings.allowed_targets if topic_allowed(delivery.target, (p,))),
                "other",
            )
        by_entry.setdefault(entry_of[delivery.target], []).append(delivery.lateness_ms)
        if logged(delivery.delay_id, settings.delivery_log_rate):
            logger.info(
                "delivered",
                delay_id=delivery.delay_id,
                target=delivery.target,
                due_ms=delivery.due_ms,
                emitted_ms=delivery.emitted_ms,
                attempt=delivery.attempt,
                lateness_ms=delivery.lateness_ms,
            )
    for entry, values in by_entry.items():
        # Its own EMF line: the `target` dimension (and the function's `service`) only.
        per_target = EphemeralMetrics(namespace=NAMESPACE)
        per_target.add_dimension(name="target", value=entry)
        for value in values:
            per_target.add_metric(
                name="LatenessByTargetMs", unit=MetricUnit.Milliseconds, value=value
            )
        if per_target.metric_set:  # Powertools flushes by itself every 100 values
            per_target.flush_metrics()
    return by_entry


def logged(delay_id: str, rate: float) -> bool:
    """Whether the deliveries of `delay_id` are logged at this sample rate: decided by the
    id, so that every attempt of a sampled id is logged, on every function."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    digest = hashlib.blake2b(delay_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate
