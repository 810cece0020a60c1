"""The package's exception hierarchy. AWS errors are translated at the adapter edge."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ConfigurationError",
    "DelayQueueError",
    "DeliveryError",
    "EnvelopeError",
    "MalformedEventError",
    "OutOfTimeError",
    "PayloadMissingError",
    "PayloadStoreError",
    "QueueError",
    "RetriesExhaustedError",
    "StoreError",
    "WatermarkConflictError",
]


class DelayQueueError(Exception):
    """Base class of every error this package raises."""


class ConfigurationError(DelayQueueError):
    """A setting is missing or invalid."""


class MalformedEventError(DelayQueueError):
    """An invocation event is not of the expected shape at all (not one bad record)."""


class RetriesExhaustedError(DelayQueueError):
    """A batch call kept failing for some items until attempts or the deadline ran out."""

    def __init__(self, operation: str, unsent: Sequence[object], last_error: str) -> None:
        super().__init__(f"{operation}: {len(unsent)} item(s) not accepted: {last_error}")
        self.operation = operation
        self.unsent = list(unsent)
        self.last_error = last_error


class OutOfTimeError(RetriesExhaustedError):
    """A call kept failing until its deadline left no time for another try (the
    invocation's, or a shorter one the layer gave it, such as a reschedule's cutoff)."""


class StoreError(DelayQueueError):
    """A DynamoDB call failed in a way that retrying will not fix."""


class WatermarkConflictError(StoreError):
    """Another scheduler moved the watermark first (conditional write failed)."""


class QueueError(DelayQueueError):
    """An SQS call failed in a way that retrying will not fix."""


class PayloadStoreError(DelayQueueError):
    """An S3 claim-check call failed."""


class PayloadMissingError(PayloadStoreError):
    """A claim-check pointer points at no object (it was never written, or has expired)."""


class EnvelopeError(DelayQueueError):
    """A delay-queue body cannot be decoded."""


class DeliveryError(DelayQueueError):
    """Kafka did not acknowledge a record."""
