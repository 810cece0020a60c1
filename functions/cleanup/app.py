"""Cleanup: DynamoDB stream TTL removals -> re-drive messages that may never have been scheduled."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from delayq import runtime
from delayq.cleanup import CleanupServices, Outcome, TtlCleanup
from delayq.clock import handler_clock
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.telemetry import NAMESPACE, report_cleanup
from delayq.tracing import traced

logger = Logger()
metrics = Metrics(namespace=NAMESPACE)
processor = BatchProcessor(event_type=EventType.DynamoDBStreams)
clock = handler_clock(__name__)


@cache
def _setup() -> CleanupServices:
    return runtime.cleanup_services(Settings.from_env())


@metrics.log_metrics
@logger.inject_lambda_context
@traced
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Each stream record succeeds or fails alone (ReportBatchItemFailures)."""
    services = _setup()
    cleanup = TtlCleanup(services, clock=clock, deadline=Deadline.from_context(context))
    outcomes: list[Outcome] = []

    def record_handler(record: DynamoDBRecord) -> None:
        outcomes.append(cleanup.handle(record.raw_event))

    response = process_partial_response(event, record_handler, processor, context)
    report_cleanup(metrics, outcomes)
    return dict(response)
