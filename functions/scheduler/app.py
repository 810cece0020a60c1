"""Scheduler: a FIFO tick -> stored messages entering the horizon -> the delay queue."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from delayq import runtime
from delayq.clock import handler_clock
from delayq.queues import DelayQueue
from delayq.retry import Deadline
from delayq.scheduler import run_scheduler
from delayq.settings import Settings
from delayq.store import MessageStore
from delayq.telemetry import NAMESPACE, report_schedule
from delayq.tracing import traced

logger = Logger()
metrics = Metrics(namespace=NAMESPACE)
clock = handler_clock(__name__)


@cache
def _setup() -> tuple[Settings, MessageStore, DelayQueue]:
    settings = Settings.from_env()
    return settings, runtime.message_store(settings), runtime.delay_queue(settings)


@metrics.log_metrics
@logger.inject_lambda_context
@traced
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The tick's content does not matter: each run works from the stored watermark."""
    settings, store, queue = _setup()
    result = run_scheduler(
        settings=settings,
        store=store,
        delay_queue=queue,
        clock=clock,
        deadline=Deadline.from_context(context, safety_ms=10_000),
    )
    report_schedule(metrics, logger, result)
    return {"batchItemFailures": []}
