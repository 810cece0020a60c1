"""The schedule source: EventBridge scheduled events, pause, extra ticks, async retries + DLQ."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from delayq_local import AwsEndpoint, Deployment, LocalFunction
from delayq_local.doubles import RecordingHandler, wait_until
from delayq_local.sources import FailureDestinations, ScheduleEventSource
from delayq_local.specs import ScheduleEventSpec
from tests.integration.support import Runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EVERY_MINUTE = ScheduleEventSpec(name="Tick", expression="rate(1 minute)", period_seconds=60)


def schedule(handler: Any, **kwargs: Any) -> ScheduleEventSource:
    values: dict[str, Any] = {
        "period_seconds": 0.3,
        "region": "us-east-1",
        "account": "123456789012",
        "retry_delays": (0.1, 0.1),
    }
    values.update(kwargs)
    return ScheduleEventSource(
        LocalFunction.of(handler, "timer", timeout_seconds=10), EVERY_MINUTE, **values
    )


def test_fires_every_period_with_the_scheduled_event_shape(running: Runner) -> None:
    handler = RecordingHandler()

    running(schedule(handler))

    assert wait_until(lambda: handler.calls >= 3, 5)
    event = handler.events[0]
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == "aws.events"
    assert event["account"] == "123456789012"
    assert event["region"] == "us-east-1"
    assert event["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/timer-Tick"]
    assert event["detail"] == {}
    assert time.strptime(event["time"], "%Y-%m-%dT%H:%M:%SZ")
    gaps = [b - a for a, b in zip(handler.times, handler.times[1:], strict=False)]
    assert all(0.2 < gap < 0.6 for gap in gaps)


def test_the_template_rate_is_the_default_period() -> None:
    assert schedule(RecordingHandler(), period_seconds=None).period_seconds == 60


def test_a_paused_schedule_misses_its_ticks(running: Runner) -> None:
    handler = RecordingHandler()
    src = running(schedule(handler))
    assert wait_until(lambda: handler.calls >= 1, 5)

    src.pause()
    assert src.paused
    time.sleep(0.4)  # let a firing in progress finish
    paused_at = handler.calls
    time.sleep(1.0)
    assert handler.calls == paused_at
    src.resume()

    assert wait_until(lambda: handler.calls > paused_at, 5)
    assert src.stats["missed"] >= 2


def test_fire_now_adds_an_extra_tick(running: Runner) -> None:
    handler = RecordingHandler()
    src = running(schedule(handler, period_seconds=30.0, first_fire_seconds=30.0))

    src.fire_now()
    src.fire_now()

    assert wait_until(lambda: handler.calls == 2, 5)
    assert handler.events[0]["id"] != handler.events[1]["id"]


def test_a_failing_invocation_is_retried_then_sent_to_the_dead_letter_queue(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    def always_fail(_event: Any, _context: Any) -> None:
        raise RuntimeError("tick queue unavailable")

    handler = RecordingHandler(always_fail)
    dlq = deployment.resources["TimerDeadLetterQueue"].ref
    src = running(
        schedule(
            handler,
            period_seconds=30.0,
            first_fire_seconds=30.0,
            retry_attempts=deployment.functions["TimerFunction"].async_retry_attempts,
            destinations=FailureDestinations(sqs=endpoint.client("sqs"), dead_letter_queue_url=dlq),
        )
    )

    src.fire_now()

    assert wait_until(lambda: src.stats["sent_to_dead_letter_queue"] == 1, 10)
    assert handler.calls == 3  # the first attempt and two retries
    assert len({e["id"] for e in handler.events}) == 1
    (message,) = endpoint.client("sqs").receive_message(
        QueueUrl=dlq, MessageAttributeNames=["All"]
    )["Messages"]
    assert json.loads(message["Body"]) == handler.events[0]
    assert message["MessageAttributes"]["ErrorMessage"]["StringValue"] == "tick queue unavailable"


def test_the_on_failure_destination_gets_an_invocation_record(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    def always_fail(_event: Any, _context: Any) -> None:
        raise ValueError("bad tick")

    handler = RecordingHandler(always_fail)
    destination = deployment.resources["CleanupFailureQueue"].ref
    src = running(
        schedule(
            handler,
            period_seconds=30.0,
            first_fire_seconds=30.0,
            retry_attempts=0,
            destinations=FailureDestinations(
                sqs=endpoint.client("sqs"), on_failure_queue_url=destination
            ),
        )
    )

    src.fire_now()

    assert wait_until(lambda: src.stats["sent_to_destination"] == 1, 10)
    (message,) = endpoint.client("sqs").receive_message(QueueUrl=destination)["Messages"]
    record = json.loads(message["Body"])
    assert record["requestContext"]["condition"] == "RetriesExhausted"
    assert record["responsePayload"] == {"errorMessage": "bad tick", "errorType": "ValueError"}
    assert record["requestPayload"] == handler.events[0]
