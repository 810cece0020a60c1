"""The DynamoDB stream source and the TTL emulator."""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid
from typing import Any

import pytest

from delayq_local import AwsEndpoint, Deployment, LocalFunction
from delayq_local.doubles import RecordingHandler, wait_until
from delayq_local.sources import StreamEventSource, TtlEmulator
from delayq_local.specs import StreamEventSpec
from tests.integration.support import Runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


def cleanup_spec(deployment: Deployment) -> StreamEventSpec:
    (spec,) = deployment.functions["CleanupFunction"].events
    assert isinstance(spec, StreamEventSpec)
    return spec


def unfiltered(deployment: Deployment, **changes: Any) -> StreamEventSpec:
    return dataclasses.replace(cleanup_spec(deployment), filter=None, **changes)


def stream_source(
    deployment: Deployment, endpoint: AwsEndpoint, handler: Any, spec: StreamEventSpec
) -> StreamEventSource:
    return StreamEventSource(
        LocalFunction.of(handler, "cleanup", timeout_seconds=10),
        spec,
        endpoint.client("dynamodbstreams"),
        region=endpoint.region,
        poll_interval=0.1,
        retry_backoff_seconds=0.05,
        sqs=endpoint.client("sqs"),
        on_failure_queue_url=deployment.resources["CleanupFailureQueue"].ref,
    )


def put(endpoint: AwsEndpoint, table: str, sk: str, **attributes: Any) -> None:
    item = {"pk": {"S": "p"}, "sk": {"S": sk}, **attributes}
    endpoint.client("dynamodb").put_item(TableName=table, Item=item)


def keys(handler: RecordingHandler) -> list[str]:
    return [r["dynamodb"]["Keys"]["sk"]["S"] for e in handler.events for r in e["Records"]]


def test_records_have_the_lambda_stream_event_shape(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    handler = RecordingHandler()
    put(endpoint, table, "a", value={"B": b"\x00\xff"}, due_ms={"N": "5"})

    running(stream_source(deployment, endpoint, handler, unfiltered(deployment)))

    assert wait_until(lambda: handler.calls == 1, 10)
    (record,) = handler.events[0]["Records"]
    assert record["eventName"] == "INSERT"
    assert record["eventSource"] == "aws:dynamodb"
    assert record["eventSourceARN"] == deployment.resources["MessageTable"].attributes["StreamArn"]
    assert record["awsRegion"] == "us-east-1"
    assert "userIdentity" not in record
    image = record["dynamodb"]["NewImage"]
    assert image["value"] == {"B": base64.b64encode(b"\x00\xff").decode()}
    assert image["due_ms"] == {"N": "5"}
    assert record["dynamodb"]["Keys"] == {"pk": {"S": "p"}, "sk": {"S": "a"}}
    assert isinstance(record["dynamodb"]["ApproximateCreationDateTime"], int)
    assert record["dynamodb"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"


def test_the_template_filter_passes_ttl_removals_only(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    handler = RecordingHandler()
    put(endpoint, table, "user-deleted")
    endpoint.client("dynamodb").delete_item(
        TableName=table, Key={"pk": {"S": "p"}, "sk": {"S": "user-deleted"}}
    )
    src = running(stream_source(deployment, endpoint, handler, cleanup_spec(deployment)))

    src.inject(
        [
            {
                "eventID": "1",
                "eventName": "REMOVE",
                "eventSource": "aws:dynamodb",
                "awsRegion": "us-east-1",
                "dynamodb": {"Keys": {"pk": {"S": "p"}, "sk": {"S": "expired"}}},
                "userIdentity": TTL_IDENTITY,
            }
        ]
    )

    assert wait_until(lambda: handler.calls == 1, 10)
    time.sleep(0.3)
    assert keys(handler) == ["expired"]
    assert src.stats["filtered"] == 2  # the INSERT and the user's own REMOVE


def test_a_partial_batch_failure_retries_from_the_first_failed_record(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    for sk in ("a", "b", "c"):
        put(endpoint, table, sk)
    failed_once: set[str] = set()

    def fail_b_once(event: Any, _context: Any) -> dict[str, Any]:
        for record in event["Records"]:
            if record["dynamodb"]["Keys"]["sk"]["S"] == "b" and "b" not in failed_once:
                failed_once.add("b")
                return {
                    "batchItemFailures": [{"itemIdentifier": record["dynamodb"]["SequenceNumber"]}]
                }
        return {"batchItemFailures": []}

    handler = RecordingHandler(fail_b_once)

    running(stream_source(deployment, endpoint, handler, unfiltered(deployment)))

    assert wait_until(lambda: handler.calls == 2, 10)
    assert [[r["dynamodb"]["Keys"]["sk"]["S"] for r in e["Records"]] for e in handler.events] == [
        ["a", "b", "c"],
        ["b", "c"],
    ]


def test_exhausted_retries_send_the_batch_to_the_on_failure_destination(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    put(endpoint, table, "poison")

    def fail_poison(event: Any, _context: Any) -> None:
        if any(r["dynamodb"]["Keys"]["sk"]["S"] == "poison" for r in event["Records"]):
            raise RuntimeError("cannot handle")

    handler = RecordingHandler(fail_poison)
    spec = unfiltered(deployment, maximum_retry_attempts=2, bisect_on_error=False)
    src = running(stream_source(deployment, endpoint, handler, spec))

    assert wait_until(lambda: src.stats["skipped_batches"] == 1, 10)
    put(endpoint, table, "after")
    assert wait_until(lambda: "after" in keys(handler), 10)
    assert keys(handler) == ["poison"] * 3 + ["after"]
    (message,) = endpoint.client("sqs").receive_message(
        QueueUrl=deployment.resources["CleanupFailureQueue"].ref
    )["Messages"]
    body = json.loads(message["Body"])
    assert body["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert body["requestContext"]["approximateInvokeCount"] == 3
    info = body["DDBStreamBatchInfo"]
    assert info["batchSize"] == 1
    assert info["streamArn"] == spec.stream_arn
    assert info["startSequenceNumber"] == info["endSequenceNumber"]


def test_an_s3_destination_keeps_the_whole_failed_batch(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    # As Lambda writes it to an S3 on-failure destination: the metadata and the records.
    table = deployment.resources["MessageTable"].ref
    bucket = f"failures-{uuid.uuid4().hex[:8]}"
    s3 = endpoint.client("s3")
    s3.create_bucket(Bucket=bucket)
    put(endpoint, table, "poison", note={"S": "old image"})

    def fail(event: Any, _context: Any) -> None:
        raise RuntimeError("cannot handle")

    spec = unfiltered(deployment, maximum_retry_attempts=0, bisect_on_error=False)
    source = StreamEventSource(
        LocalFunction.of(RecordingHandler(fail), "cleanup", timeout_seconds=10),
        spec,
        endpoint.client("dynamodbstreams"),
        region=endpoint.region,
        poll_interval=0.1,
        retry_backoff_seconds=0.05,
        s3=s3,
        on_failure_bucket=bucket,
    )
    src = running(source)
    assert wait_until(lambda: src.stats["skipped_batches"] == 1, 10)
    (listed,) = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert listed["Key"].startswith(f"aws/lambda/{source.mapping_id}/")
    body = json.loads(s3.get_object(Bucket=bucket, Key=listed["Key"])["Body"].read())
    assert body["DDBStreamBatchInfo"]["batchSize"] == 1
    (record,) = body["payload"]["Records"]
    assert record["dynamodb"]["NewImage"]["note"] == {"S": "old image"}


def test_bisection_isolates_the_failing_record(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    for sk in ("a", "b", "poison", "d"):
        put(endpoint, table, sk)

    def fail_poison(event: Any, _context: Any) -> None:
        if any(r["dynamodb"]["Keys"]["sk"]["S"] == "poison" for r in event["Records"]):
            raise RuntimeError("cannot handle")

    handler = RecordingHandler(fail_poison)
    spec = unfiltered(deployment, maximum_retry_attempts=0, report_batch_item_failures=False)
    src = running(stream_source(deployment, endpoint, handler, spec))

    assert wait_until(lambda: src.stats["skipped_records"] == 1, 10)
    assert wait_until(lambda: {"a", "b", "d"} <= set(keys(handler)), 10)
    assert src.stats["bisections"] >= 1


def test_the_ttl_emulator_expires_items_and_reports_ttl_removals(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    now = int(time.time())
    for sk in ("old-1", "old-2"):
        put(endpoint, table, sk, expires_at={"N": str(now - 10)}, kind={"S": "msg"})
    put(endpoint, table, "future", expires_at={"N": str(now + 3600)})
    put(endpoint, table, "not-a-number", expires_at={"S": "soon"})
    put(endpoint, table, "no-ttl")
    handler = RecordingHandler()
    stream = running(stream_source(deployment, endpoint, handler, cleanup_spec(deployment)))
    ttl = TtlEmulator(
        endpoint.client("dynamodb"),
        table,
        "expires_at",
        ["pk", "sk"],
        streams=[stream],
        region=endpoint.region,
    )

    assert ttl.sweep() == 2

    assert wait_until(lambda: len(keys(handler)) == 2, 10)
    time.sleep(0.3)
    assert sorted(keys(handler)) == ["old-1", "old-2"]
    record = handler.events[0]["Records"][0]
    assert record["eventName"] == "REMOVE"
    assert record["userIdentity"] == TTL_IDENTITY
    assert record["dynamodb"]["OldImage"]["kind"] == {"S": "msg"}
    assert record["eventSourceARN"] == stream.spec.stream_arn
    remaining = endpoint.client("dynamodb").scan(TableName=table)["Items"]
    assert sorted(i["sk"]["S"] for i in remaining) == ["future", "no-ttl", "not-a-number"]


def test_the_ttl_emulator_runs_on_its_period(
    deployment: Deployment, endpoint: AwsEndpoint, running: Runner
) -> None:
    table = deployment.resources["MessageTable"].ref
    put(endpoint, table, "soon", expires_at={"N": str(int(time.time()) + 1)})
    ttl = running(
        TtlEmulator(
            endpoint.client("dynamodb"),
            table,
            "expires_at",
            ["pk", "sk"],
            period_seconds=0.2,
            region=endpoint.region,
        )
    )

    assert wait_until(lambda: ttl.stats["expired"] == 1, 10)
    assert endpoint.client("dynamodb").scan(TableName=table)["Items"] == []
