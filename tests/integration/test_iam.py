"""Each function's calls against its role in template.yaml, as IAM evaluates them: the roles of
the real template provisioned on moto, calls checked one by one, and a stack run whose
template lacks grants (every refusal recorded, the calls answered AccessDenied)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from delayq import constants as c
from delayq_local import AwsEndpoint, EmbeddedStack, StackConfig, load_template, provision
from delayq_local.iam import IamGuard
from delayq_local.producer import DelayProducer, Due
from delayq_local.provision import Deployment
from delayq_local.sandbox import acting_as
from delayq_local.stack import LOCAL_PARAMETERS, TimeCompression, iam_guard
from tests.integration.support import PROJECT_ROOT

pytestmark = [pytest.mark.integration]

PARAMETERS = {
    **LOCAL_PARAMETERS,
    "KafkaBootstrapServers": "localhost:9092",
    "AllowedTargets": "demo.*",
}
Edit = Callable[[dict[str, Any]], None]


def _statements(body: Mapping[str, Any], role: str) -> list[dict[str, Any]]:
    [policy] = body["Resources"][role]["Properties"]["Policies"][:1]
    statements: list[dict[str, Any]] = policy["PolicyDocument"]["Statement"]
    return statements


def without_statement(role: str, sid: str) -> Edit:
    def edit(body: dict[str, Any]) -> None:
        statements = _statements(body, role)
        kept = [s for s in statements if s.get("Sid") != sid]
        assert len(kept) == len(statements) - 1, f"{role} has no statement {sid}"
        statements[:] = kept

    return edit


def without_resource(role: str, sid: str, logical_id: str) -> Edit:
    def edit(body: dict[str, Any]) -> None:
        [statement] = [s for s in _statements(body, role) if s.get("Sid") == sid]
        resources = statement["Resource"]
        statement["Resource"] = [r for r in resources if r != {"Fn::GetAtt": [logical_id, "Arn"]}]
        assert len(statement["Resource"]) == len(resources) - 1

    return edit


def template_copy(tmp_path: Path, *edits: Edit) -> Path:
    """template.yaml with `edits` applied, in a folder where its code paths resolve."""
    body = json.loads(json.dumps(load_template(PROJECT_ROOT / "template.yaml").body))
    for edit in edits:
        edit(body)
    for folder in ("functions", "layers"):
        (tmp_path / folder).symlink_to(PROJECT_ROOT / folder)
    path = tmp_path / "template.json"
    path.write_text(json.dumps(body))
    return path


def deploy(endpoint: AwsEndpoint, stack_name: str, template: Path) -> Deployment:
    return provision(load_template(template), stack_name, endpoint, PARAMETERS)


@pytest.fixture
def real(endpoint: AwsEndpoint, stack_name: str) -> Deployment:
    return deploy(endpoint, stack_name, PROJECT_ROOT / "template.yaml")


def queue(deployment: Deployment, logical_id: str) -> dict[str, Any]:
    return {"QueueUrl": deployment.resources[logical_id].ref, "Entries": []}


def keys(deployment: Deployment, *pks: str) -> dict[str, Any]:
    table = deployment.resources["MessageTable"].ref
    return {"RequestItems": {table: {"Keys": [{c.ATTR_PK: {"S": pk}} for pk in pks]}}}


def item(deployment: Deployment, pk: str) -> dict[str, Any]:
    return {"TableName": deployment.resources["MessageTable"].ref, "Item": {c.ATTR_PK: {"S": pk}}}


def refused(guard: IamGuard, function: str, service: str, operation: str, params: Any) -> str:
    denial = guard.check(function, service, operation, params)
    return denial.reason if denial else ""


def test_every_function_of_the_template_has_its_role_read(real: Deployment) -> None:
    guard = iam_guard(real)
    assert (
        set(guard.policies)
        == set(real.functions)
        >= {
            "IngestFunction",
            "TimerFunction",
            "SchedulerFunction",
            "EmitterFunction",
            "CleanupFunction",
        }
    )


def test_the_emitter_re_queues_and_dead_letters_on_its_own_queues_only(real: Deployment) -> None:
    guard = iam_guard(real)
    for granted in ("DelayQueue", "DelayHighQueue", "DelayLowQueue", "DelayDeadLetterQueue"):
        assert not refused(
            guard, "EmitterFunction", "sqs", "SendMessageBatch", queue(real, granted)
        )
    assert refused(guard, "EmitterFunction", "sqs", "SendMessageBatch", queue(real, "TickQueue"))
    assert not refused(guard, "EmitterFunction", "sqs", "ReceiveMessage", queue(real, "DelayQueue"))


def test_a_role_reaches_only_its_partition_keys(real: Deployment) -> None:
    guard = iam_guard(real)
    table = real.resources["MessageTable"].ref
    assert not refused(guard, "EmitterFunction", "dynamodb", "BatchGetItem", keys(real, "cancel#3"))
    # ForAllValues: one key outside the grant refuses the whole batch.
    assert refused(
        guard,
        "EmitterFunction",
        "dynamodb",
        "BatchGetItem",
        keys(real, "cancel#3", "meta#watermark"),
    )
    assert not refused(guard, "EmitterFunction", "dynamodb", "PutItem", item(real, "stats#1"))
    assert refused(guard, "EmitterFunction", "dynamodb", "PutItem", item(real, "cancel#1"))
    watermark = {"TableName": table, "Key": {c.ATTR_PK: {"S": c.WATERMARK_PK}}}
    assert not refused(guard, "IngestFunction", "dynamodb", "GetItem", watermark)
    assert refused(guard, "EmitterFunction", "dynamodb", "GetItem", watermark)


def test_payloads_are_read_by_the_emitter_and_deleted_by_no_one(real: Deployment) -> None:
    guard = iam_guard(real)
    bucket = real.resources["PayloadBucket"].ref
    payload = {"Bucket": bucket, "Key": "payloads/2026/x"}
    assert not refused(guard, "EmitterFunction", "s3", "GetObject", payload)
    assert not refused(guard, "IngestFunction", "s3", "PutObject", payload)
    for function in real.functions:
        assert refused(guard, function, "s3", "DeleteObject", payload), function
    # ListBucket, so that a missing payload is NoSuchKey (S3 checks it with no prefix).
    assert not refused(guard, "EmitterFunction", "s3", "ListObjectsV2", {"Bucket": bucket})


@pytest.mark.parametrize(
    ("edits", "code"),
    [
        ((), "NoSuchKey"),
        ((without_statement("EmitterRole", "MissingPayloadIsNotFound"),), "AccessDenied"),
    ],
)
def test_a_missing_payload_is_not_found_only_to_a_role_that_may_list_the_bucket(
    endpoint: AwsEndpoint,
    stack_name: str,
    tmp_path: Path,
    edits: tuple[Edit, ...],
    code: str,
) -> None:
    deployment = deploy(endpoint, stack_name, template_copy(tmp_path, *edits))
    guard = iam_guard(deployment)
    s3 = endpoint.client("s3")
    guard.install(s3.meta.events)
    bucket = deployment.resources["PayloadBucket"].ref
    try:
        with acting_as("EmitterFunction"), pytest.raises(ClientError) as raised:
            s3.get_object(Bucket=bucket, Key="payloads/2026/gone")
    finally:
        guard.remove()
    assert raised.value.response["Error"]["Code"] == code
    assert len(guard.denials) == (code == "AccessDenied")


def test_the_cleanup_event_source_reads_the_table_stream(real: Deployment) -> None:
    guard = iam_guard(real)
    stream = real.resources["MessageTable"].attributes["StreamArn"]
    iterator = {"ShardIterator": f"{stream}|1|AAAA"}
    assert not refused(guard, "CleanupFunction", "dynamodb-streams", "GetRecords", iterator)
    assert refused(guard, "EmitterFunction", "dynamodb-streams", "GetRecords", iterator)


def test_a_call_with_no_iam_mapping_is_refused_with_its_name(real: Deployment) -> None:
    guard = iam_guard(real)

    reason = refused(guard, "EmitterFunction", "sns", "Publish", {"TopicArn": "arn:x"})

    assert "no IAM mapping for sns.Publish" in reason


def test_a_missing_re_queue_grant_is_refused(
    endpoint: AwsEndpoint, stack_name: str, tmp_path: Path
) -> None:
    # The grant whose absence made every partial Kafka failure an AccessDenied in AWS.
    edited = template_copy(
        tmp_path, without_resource("EmitterRole", "SendRetriesDeadLettersAndRejects", "DelayQueue")
    )
    deployment = deploy(endpoint, stack_name, edited)
    guard = iam_guard(deployment)

    reason = refused(
        guard, "EmitterFunction", "sqs", "SendMessageBatch", queue(deployment, "DelayQueue")
    )

    assert reason == "no identity-based policy allows it"
    assert not refused(
        guard, "EmitterFunction", "sqs", "SendMessageBatch", queue(deployment, "DelayHighQueue")
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.iam_denials_expected
def test_a_stack_whose_roles_lack_grants_records_every_refused_call(
    stack_name: str, tmp_path: Path
) -> None:
    edited = template_copy(
        tmp_path,
        without_statement("EmitterRole", "ReadCancelMarkersAndLateCounts"),
        without_statement("CleanupRole", "ReadStream"),
    )
    config = StackConfig(
        project_root=PROJECT_ROOT,
        template=edited,
        stack_name=stack_name,
        parameters={"AllowedTargets": "demo.*"},
        topics=("demo.iam",),
        environment={"LOG_LEVEL": "ERROR"},
        time=TimeCompression(
            horizon_seconds=15, lookahead_seconds=10, tick_seconds=2, ttl_grace_seconds=10
        ),
    )
    with EmbeddedStack(config) as stack:
        with DelayProducer(stack.kafka_bootstrap, stack.delay_topic) as producer:
            # Due in 5 s: past the direct path's window however late ingest reads it, so the
            # emitter (whose marker read is refused) delivers it.
            producer.send("demo.iam", Due(at_ms=int(time.time() * 1000) + 5000), delay_id="i-1")
        give_up = time.monotonic() + 90
        wanted = {"EmitterFunction: dynamodb.BatchGetItem", "CleanupFunction: dynamodb-streams"}
        while time.monotonic() < give_up:
            seen = {str(d) for d in stack.iam_denials()}
            if all(any(s.startswith(w) for s in seen) for w in wanted):
                break
            time.sleep(0.5)
        denials = stack.iam_denials()
    by_call = {(d.function, d.call): d for d in denials}
    batch_get = by_call[("EmitterFunction", "dynamodb.BatchGetItem")]
    assert "dynamodb:BatchGetItem" in batch_get.request
    assert batch_get.reason == "no identity-based policy allows it"
    # The event source (Lambda's poller) acts with the function's role.
    assert ("CleanupFunction", "dynamodb-streams.DescribeStream") in by_call
