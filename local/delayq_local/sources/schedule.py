"""The schedule source: an EventBridge rule invoking the function asynchronously every period.

Asynchronous invocation semantics: a failed invocation is retried `MaximumRetryAttempts` times
(Lambda waits about 1 and 2 minutes; here `retry_delays`), then the event goes to the function's
dead-letter queue (`DeadLetterQueue`, SQS) or its on-failure destination (`EventInvokeConfig`).
`pause()` disables the rule (ticks are missed, not queued); `fire_now()` adds an extra tick
(EventBridge may deliver one twice).
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from delayq_local.sandbox import Invocation, LocalFunction
from delayq_local.sources.base import EventSource
from delayq_local.specs import ScheduleEventSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FailureDestinations:
    """Where an asynchronous event goes after its last failed attempt (SQS queue URLs)."""

    sqs: Any = None
    dead_letter_queue_url: str | None = None
    on_failure_queue_url: str | None = None


@dataclass(order=True)
class _Attempt:
    due: float
    attempt: int
    event: Any = field(compare=False)


class ScheduleEventSource(EventSource):
    """Fires every `period_seconds` (the template's rate unless overridden)."""

    def __init__(
        self,
        function: LocalFunction,
        spec: ScheduleEventSpec,
        *,
        period_seconds: float | None = None,
        region: str,
        account: str,
        retry_attempts: int = 2,
        retry_delays: Sequence[float] = (1.0, 2.0),
        destinations: FailureDestinations | None = None,
        first_fire_seconds: float = 0.0,
    ) -> None:
        super().__init__(f"{function.name}:{spec.name}", function)
        period = period_seconds if period_seconds is not None else spec.period_seconds
        if period is None or period <= 0:
            raise ValueError(f"{spec.expression}: give the schedule an explicit local period")
        self.spec = spec
        self.period_seconds = period
        self.rule_arn = f"arn:aws:events:{region}:{account}:rule/{function.name}-{spec.name}"
        self._region = region
        self._account = account
        self._retry_attempts = retry_attempts
        self._retry_delays = tuple(retry_delays) or (1.0,)
        self._destinations = destinations or FailureDestinations()
        self._first_fire = first_fire_seconds
        self._queue: list[_Attempt] = []
        self._lock = threading.Lock()

    def fire_now(self) -> None:
        """Deliver one extra scheduled event as soon as the worker wakes."""
        self._push(_Attempt(time.monotonic(), 0, self._event()))

    def _push(self, attempt: _Attempt) -> None:
        with self._lock:
            heapq.heappush(self._queue, attempt)

    def _pop_due(self) -> _Attempt | None:
        with self._lock:
            if self._queue and self._queue[0].due <= time.monotonic():
                return heapq.heappop(self._queue)
            return None

    def _work(self, index: int) -> None:
        next_fire = time.monotonic() + self._first_fire
        while self._active():
            now = time.monotonic()
            if now >= next_fire:
                if now - next_fire < self.period_seconds:
                    self._push(_Attempt(now, 0, self._event()))
                else:
                    # The rule was disabled (paused) over whole periods: those ticks are lost.
                    self.stats.add("missed", int((now - next_fire) // self.period_seconds))
                while next_fire <= now:
                    next_fire += self.period_seconds
            while (attempt := self._pop_due()) is not None:
                self._run(index, attempt)
            self._sleep(max(0.0, min(next_fire - time.monotonic(), 0.1)))

    def _run(self, index: int, attempt: _Attempt) -> None:
        invocation = self._invoke(index, attempt.event, 1)
        if invocation.ok:
            return
        if attempt.attempt < self._retry_attempts:
            delay = self._retry_delays[min(attempt.attempt, len(self._retry_delays) - 1)]
            self._push(_Attempt(time.monotonic() + delay, attempt.attempt + 1, attempt.event))
            self.stats.add("retries")
            return
        self._give_up(attempt, invocation)

    def _give_up(self, attempt: _Attempt, invocation: Invocation) -> None:
        destinations = self._destinations
        error_type, message = invocation.describe_error()
        self.stats.add("exhausted")
        if destinations.on_failure_queue_url:
            record = {
                "version": "1.0",
                "timestamp": _iso_now(),
                "requestContext": {
                    "requestId": invocation.request_id,
                    "functionArn": self.function.arn if self.function else "",
                    "condition": "RetriesExhausted",
                    "approximateInvokeCount": attempt.attempt + 1,
                },
                "requestPayload": attempt.event,
                "responseContext": {
                    "statusCode": 200,
                    "executedVersion": "$LATEST",
                    "functionError": "Unhandled",
                },
                "responsePayload": {"errorMessage": message, "errorType": error_type},
            }
            destinations.sqs.send_message(
                QueueUrl=destinations.on_failure_queue_url, MessageBody=json.dumps(record)
            )
            self.stats.add("sent_to_destination")
        elif destinations.dead_letter_queue_url:
            destinations.sqs.send_message(
                QueueUrl=destinations.dead_letter_queue_url,
                MessageBody=json.dumps(attempt.event),
                MessageAttributes={
                    "RequestID": {"DataType": "String", "StringValue": invocation.request_id},
                    "ErrorCode": {"DataType": "Number", "StringValue": "200"},
                    "ErrorMessage": {"DataType": "String", "StringValue": message[:1024] or "-"},
                },
            )
            self.stats.add("sent_to_dead_letter_queue")
        else:
            log.error(
                "%s: event dropped after %d attempts: %s", self.name, attempt.attempt + 1, message
            )

    def _event(self) -> Any:
        if self.spec.input is not None:
            return json.loads(json.dumps(self.spec.input))
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": self._account,
            "time": _iso_now(),
            "region": self._region,
            "resources": [self.rule_arn],
            "detail": {},
        }


def _iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
