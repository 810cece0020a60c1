"""Emitter: the SQS delay queue -> the target Kafka topics, at due time, never early."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from delayq import runtime
from delayq.clock import handler_clock
from delayq.emitter import EmitterServices, emit_batch, messages_from_event
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.telemetry import NAMESPACE, report_emit
from delayq.tracing import traced

logger = Logger()
metrics = Metrics(namespace=NAMESPACE)
clock = handler_clock(__name__)


@cache
def _setup() -> tuple[Settings, EmitterServices]:
    settings = Settings.from_env()
    return settings, runtime.emitter_services(settings)


@metrics.log_metrics
@logger.inject_lambda_context
@traced
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Returns the partial batch response: only the failed (or re-delayed) messages."""
    settings, services = _setup()
    result = emit_batch(
        messages_from_event(event),
        settings=settings,
        services=services,
        clock=clock,
        sleep=time.sleep,
        deadline=Deadline.from_context(context),
    )
    return report_emit(metrics, logger, result, settings)
