"""Event sources emulated with AWS's event shapes and semantics, each in its own thread(s)."""

from delayq_local.sources.base import Counters, EventSource, failed_items
from delayq_local.sources.kafka import KafkaEventSource, java_bytes
from delayq_local.sources.schedule import FailureDestinations, ScheduleEventSource
from delayq_local.sources.sqs import SqsEventSource
from delayq_local.sources.streams import StreamEventSource, event_value
from delayq_local.sources.ttl import TtlEmulator

__all__ = [
    "Counters",
    "EventSource",
    "FailureDestinations",
    "KafkaEventSource",
    "ScheduleEventSource",
    "SqsEventSource",
    "StreamEventSource",
    "TtlEmulator",
    "event_value",
    "failed_items",
    "java_bytes",
]
