"""The SQS event source: batches, deletes, partial batch responses, redrive, latency."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Any

import pytest

from delayq_local import AwsEndpoint, Deployment, LocalFunction, loads_template, provision
from delayq_local.doubles import RecordingHandler, wait_until
from delayq_local.filters import EventFilter
from delayq_local.sources import SqsEventSource
from delayq_local.specs import SqsEventSpec
from tests.integration.support import Runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def emitter_spec(deployment: Deployment) -> SqsEventSpec:
    (spec,) = deployment.functions["EmitterFunction"].events
    assert isinstance(spec, SqsEventSpec)
    return spec


def source(
    deployment: Deployment,
    endpoint: AwsEndpoint,
    handler: Any,
    spec: SqsEventSpec | None = None,
    *,
    timeout: float = 5.0,
    visibility_timeout: int | None = 1,
) -> SqsEventSource:
    spec = spec or emitter_spec(deployment)
    return SqsEventSource(
        LocalFunction.of(handler, "emitter", timeout_seconds=timeout),
        spec,
        endpoint.client("sqs"),
        deployment.by_arn(spec.queue_arn).ref,
        region=endpoint.region,
        visibility_timeout=visibility_timeout,
    )


def send(endpoint: AwsEndpoint, url: str, bodies: list[str], **extra: Any) -> None:
    sqs = endpoint.client("sqs")
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body, **extra)


def queue_depth(endpoint: AwsEndpoint, url: str) -> int:
    attributes = endpoint.client("sqs").get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def bodies_seen(handler: RecordingHandler) -> list[str]:
    return [r["body"] for event in handler.events for r in event["Records"]]


def test_a_batch_has_the_sqs_event_shape_and_is_deleted_after_success(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref
    handler = RecordingHandler()
    send(
        endpoint,
        url,
        ["hello"],
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "greeting"},
            "raw": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        },
    )

    running(source(deployment, endpoint, handler))

    assert wait_until(lambda: handler.calls == 1, 10)
    (record,) = handler.events[0]["Records"]
    assert record["body"] == "hello"
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == deployment.resources["DelayQueue"].attributes["Arn"]
    assert record["awsRegion"] == "us-east-1"
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert int(record["attributes"]["SentTimestamp"]) <= time.time() * 1000
    assert record["messageAttributes"]["kind"] == {
        "stringValue": "greeting",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }
    assert record["messageAttributes"]["raw"]["binaryValue"] == "AP8="
    assert record["messageId"]
    assert record["receiptHandle"]
    assert record["md5OfBody"]
    context = handler.contexts[0]
    assert context.function_name == "emitter"
    assert 0 < context.get_remaining_time_in_millis() <= 5000
    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 5)


def test_partial_batch_response_deletes_only_the_successes(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref

    def fail_odd_numbers_once(event: Any, _context: Any) -> dict[str, Any]:
        failures = [
            {"itemIdentifier": r["messageId"]}
            for r in event["Records"]
            if int(r["body"]) % 2 and r["attributes"]["ApproximateReceiveCount"] == "1"
        ]
        return {"batchItemFailures": failures}

    handler = RecordingHandler(fail_odd_numbers_once)
    send(endpoint, url, [str(i) for i in range(6)])

    src = running(source(deployment, endpoint, handler))

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 15)
    seen = bodies_seen(handler)
    assert sorted(seen) == sorted([str(i) for i in range(6)] + ["1", "3", "5"])
    assert src.stats["item_failures"] == 3


def test_a_raising_handler_gets_the_whole_batch_again(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref

    def fail_first_time(event: Any, _context: Any) -> None:
        if event["Records"][0]["attributes"]["ApproximateReceiveCount"] == "1":
            raise RuntimeError("downstream unavailable")

    handler = RecordingHandler(fail_first_time)
    send(endpoint, url, ["a", "b", "c"])

    src = running(source(deployment, endpoint, handler))

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 15)
    counts = {
        r["body"]: r["attributes"]["ApproximateReceiveCount"] for r in handler.events[-1]["Records"]
    }
    assert sorted(bodies_seen(handler)) == ["a", "a", "b", "b", "c", "c"]
    assert set(counts.values()) == {"2"}
    assert src.stats["errors"] >= 1


def test_an_invalid_partial_response_fails_the_whole_batch(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref

    def unknown_id_first_time(event: Any, _context: Any) -> dict[str, Any]:
        if event["Records"][0]["attributes"]["ApproximateReceiveCount"] == "1":
            return {"batchItemFailures": [{"itemIdentifier": "no-such-message"}]}
        return {"batchItemFailures": []}

    handler = RecordingHandler(unknown_id_first_time)
    send(endpoint, url, ["x", "y"])

    running(source(deployment, endpoint, handler))

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 15)
    assert sorted(bodies_seen(handler)) == ["x", "x", "y", "y"]


def test_without_report_batch_item_failures_a_returned_list_is_ignored(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref
    spec = dataclasses.replace(emitter_spec(deployment), report_batch_item_failures=False)

    def claims_failures(event: Any, _context: Any) -> dict[str, Any]:
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"]]}

    handler = RecordingHandler(claims_failures)
    send(endpoint, url, ["only-once"])

    running(source(deployment, endpoint, handler, spec))

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 10)
    time.sleep(1.5)  # past the visibility timeout: a kept message would be back
    assert bodies_seen(handler) == ["only-once"]


def test_an_invocation_past_its_timeout_counts_as_failed(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref

    def slow_first_time(event: Any, _context: Any) -> None:
        if event["Records"][0]["attributes"]["ApproximateReceiveCount"] == "1":
            time.sleep(0.4)

    handler = RecordingHandler(slow_first_time)
    send(endpoint, url, ["slow"])

    src = running(source(deployment, endpoint, handler, timeout=0.2))

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 15)
    assert bodies_seen(handler) == ["slow", "slow"]
    assert src.stats["errors"] == 1


def test_each_environment_loads_its_own_handler_and_batches_run_in_parallel(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref
    spec = dataclasses.replace(emitter_spec(deployment), batch_size=1)
    loaded: list[RecordingHandler] = []
    spans: list[tuple[float, float]] = []

    def half_a_second(_event: Any, _context: Any) -> None:
        began = time.monotonic()
        time.sleep(0.5)
        spans.append((began, time.monotonic()))

    def load() -> RecordingHandler:
        handler = RecordingHandler(half_a_second)
        loaded.append(handler)
        return handler

    send(endpoint, url, ["1", "2", "3"])

    running(
        SqsEventSource(
            LocalFunction(name="emitter", loader=load, timeout_seconds=5),
            spec,
            endpoint.client("sqs"),
            url,
            region=endpoint.region,
            concurrency=3,
        )
    )

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 10)
    # Three half-second invocations side by side: some instant lies inside all three (read
    # from the handlers' own clocks, so a slow machine cannot fake or hide it).
    assert len(spans) == 3
    assert max(began for began, _ in spans) < min(ended for _, ended in spans)
    assert len(loaded) == 3
    assert [h.calls for h in loaded] == [1, 1, 1]


def test_sqs_redrives_to_the_dead_letter_queue_after_max_receive_count(
    endpoint: AwsEndpoint, stack_name: str, running: Runner
) -> None:
    deployment = provision(
        loads_template(
            """
Resources:
  Dlq: {Type: AWS::SQS::Queue}
  Queue:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 1
      RedrivePolicy: {deadLetterTargetArn: !GetAtt Dlq.Arn, maxReceiveCount: 2}
"""
        ),
        stack_name,
        endpoint,
    )
    url = deployment.resources["Queue"].ref
    spec = SqsEventSpec(name="q", queue_arn=deployment.resources["Queue"].attributes["Arn"])

    def always_fail(_event: Any, _context: Any) -> None:
        raise RuntimeError("poison")

    handler = RecordingHandler(always_fail)
    send(endpoint, url, ["poison"])

    running(source(deployment, endpoint, handler, spec, visibility_timeout=None))

    dlq = deployment.resources["Dlq"].ref
    assert wait_until(lambda: queue_depth(endpoint, dlq) == 1, 15)
    assert handler.calls == 2
    assert queue_depth(endpoint, url) == 0
    moved = endpoint.client("sqs").receive_message(QueueUrl=dlq)["Messages"]
    assert moved[0]["Body"] == "poison"


def test_messages_the_filter_drops_are_deleted_without_an_invocation(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    url = deployment.resources["DelayQueue"].ref
    spec = dataclasses.replace(
        emitter_spec(deployment),
        filter=EventFilter.from_criteria(
            {"Filters": [{"Pattern": json.dumps({"body": {"target": [{"prefix": "orders."}]}})}]}
        ),
    )
    handler = RecordingHandler()
    send(endpoint, url, [json.dumps({"target": "orders.eu"}), json.dumps({"target": "x"}), "text"])

    src = running(source(deployment, endpoint, handler, spec))

    assert wait_until(lambda: queue_depth(endpoint, url) == 0, 10)
    assert bodies_seen(handler) == [json.dumps({"target": "orders.eu"})]
    assert src.stats["filtered"] == 2


@pytest.mark.parametrize(
    ("wait_seconds", "bound_ms"),
    [pytest.param(0, 500, id="short-poll-50ms"), pytest.param(1, 1500, id="long-poll")],
)
def test_receive_latency_after_delay_seconds_expiry(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner, wait_seconds: int, bound_ms: int
) -> None:
    """How soon the poller sees a message after its DelaySeconds expire (printed; bounded).

    moto wakes a long poll for a new message at once, but notices a delayed one becoming
    visible only on its one-second re-check; short polling bounds the latency by its interval.
    """
    url = deployment.resources["DelayQueue"].ref
    handler = RecordingHandler()
    spec = emitter_spec(deployment)
    running(
        SqsEventSource(
            LocalFunction.of(handler, "emitter"),
            spec,
            endpoint.client("sqs"),
            url,
            region=endpoint.region,
            wait_seconds=wait_seconds,
            idle_sleep=0.05,
        )
    )
    sqs = endpoint.client("sqs")
    count = 40
    for i in range(count):
        delay = 1 + i % 3
        sqs.send_message(
            QueueUrl=url,
            MessageBody=str(delay),
            DelaySeconds=delay,
        )
        time.sleep(0.037)

    assert wait_until(lambda: sum(len(e["Records"]) for e in handler.events) == count, 20)
    latencies = sorted(
        received * 1000 - int(r["attributes"]["SentTimestamp"]) - int(r["body"]) * 1000
        for received, event in zip(handler.times, handler.events, strict=True)
        for r in event["Records"]
    )
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(
        f"SQS receive latency after DelaySeconds, wait_seconds={wait_seconds}: "
        f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {latencies[-1]:.0f} ms, "
        f"min {latencies[0]:.0f} ms (n={count})"
    )
    assert latencies[0] >= -5  # never before the delay (moto's clock is ours; ms rounding)
    assert latencies[-1] < bound_ms
