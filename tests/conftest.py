"""Shared fixtures: fake AWS credentials, moto resources, a controllable clock."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from delayq.settings import Settings
from testkit.clock import FakeClock
from testkit.lambda_context import LambdaContext
from tests.factories import REGION, TARGETS, AwsResources


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials so no test can reach a real account."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_DEV": "false",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # Never the state file of a `delayq local` running on this machine.
    monkeypatch.setenv("DELAYQ_STATE_FILE", "/nonexistent/delayq-test-state.json")


@pytest.fixture(autouse=True)
def no_call_iam_would_refuse(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every local stack a test runs checks each function's calls against its role in the
    template (`delayq_local.iam`): a call AWS would refuse fails the test, even when the code
    under test recovers from the AccessDenied."""
    from delayq_local.stack import EmbeddedStack

    refused: list[str] = []
    stop = EmbeddedStack.stop

    def stop_and_collect(stack: EmbeddedStack) -> None:
        refused.extend(str(denial) for denial in stack.iam_denials())
        stop(stack)

    monkeypatch.setattr(EmbeddedStack, "stop", stop_and_collect)
    yield
    if request.node.get_closest_marker("iam_denials_expected"):
        return
    assert not refused, "calls AWS would refuse (a role in template.yaml lacks a grant):\n" + (
        "\n".join(refused)
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings() -> Settings:
    return Settings(
        table_name="delayq-messages",
        delay_queue_url="",
        tick_queue_url="",
        reject_queue_url="",
        payload_bucket="delayq-payloads",
        allowed_targets=TARGETS,
        shards=4,
        kafka_bootstrap="mock:9092",
    )


@pytest.fixture
def aws(settings: Settings) -> Iterator[AwsResources]:
    """moto with the table (TTL, stream), the queues and the bucket; settings point at them."""
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        table = dynamodb.create_table(
            TableName=settings.table_name,
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        )
        dynamodb.update_time_to_live(
            TableName=settings.table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"},
        )
        sqs = boto3.client("sqs", region_name=REGION)
        delay_dlq = sqs.create_queue(QueueName="delayq-delay-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=delay_dlq, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        delay = sqs.create_queue(
            QueueName="delayq-delay",
            Attributes={
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 10})
            },
        )["QueueUrl"]
        tick = sqs.create_queue(QueueName="delayq-tick.fifo", Attributes={"FifoQueue": "true"})[
            "QueueUrl"
        ]
        reject = sqs.create_queue(QueueName="delayq-reject")["QueueUrl"]
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=settings.payload_bucket)
        wired = settings.with_overrides(
            delay_queue_url=delay,
            tick_queue_url=tick,
            reject_queue_url=reject,
            delay_dlq_url=delay_dlq,
        )
        yield AwsResources(
            wired,
            dynamodb,
            sqs,
            s3,
            table["TableDescription"]["LatestStreamArn"],
            {"delay_dlq": delay_dlq},
        )


@pytest.fixture
def lambda_context() -> LambdaContext:
    return LambdaContext()
