"""Ingest: Kafka (MSK or self-managed) delay topic -> SQS, DynamoDB, cancels, rejects."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from delayq import runtime
from delayq.clock import handler_clock
from delayq.ingest import IngestServices, ingest_batch
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.telemetry import NAMESPACE, report_ingest
from delayq.tracing import traced

logger = Logger()
metrics = Metrics(namespace=NAMESPACE)
clock = handler_clock(__name__)


@cache
def _setup() -> tuple[Settings, IngestServices]:
    settings = Settings.from_env()
    return settings, runtime.ingest_services(settings)


@metrics.log_metrics
@logger.inject_lambda_context
@traced
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Raises when a valid record could not be kept, so Kafka redelivers the batch."""
    settings, services = _setup()
    result = ingest_batch(
        event,
        settings=settings,
        services=services,
        clock=clock,
        deadline=Deadline.from_context(context),
    )
    return report_ingest(metrics, logger, result, settings)
