"""The fault injectors themselves, against the moto server: each does what it says (a `Failed[]`
entry was really not sent, an unprocessed item really not written), only to the handlers'
clients, as often as its budget says."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import boto3
import pytest
from botocore.exceptions import ClientError

from delayq.retry import is_retryable
from delayq_local import AwsEndpoint, MotoServer, Template, provision
from delayq_local.faults import (
    ActiveFaults,
    AwsFault,
    Calls,
    Crash,
    FaultPlan,
    PartialBatch,
    PauseSource,
    ServerError,
    Stack,
    Throttle,
)
from delayq_local.sandbox import LocalFunction, RuntimeCrash, acting_as, current_function

pytestmark = pytest.mark.integration

FUNCTION = "IngestFunction"


@pytest.fixture
def install() -> Iterator[Any]:
    installed: list[ActiveFaults] = []

    def _install(*faults: AwsFault, **plan: Any) -> ActiveFaults:
        active = FaultPlan(aws=faults, **plan).install()
        installed.append(active)
        return active

    yield _install
    for active in installed:
        active.remove()


def handler_client(service: str, server: MotoServer, function: str = FUNCTION) -> Any:
    """A client built the way a handler builds its own: from the default session, during one
    of its invocations."""
    with acting_as(function):
        return boto3.client(service, endpoint_url=server.endpoint_url, region_name="us-east-1")


@pytest.fixture
def queue(endpoint: AwsEndpoint) -> str:
    url: str = endpoint.client("sqs").create_queue(QueueName=f"q-{uuid.uuid4().hex[:8]}")[
        "QueueUrl"
    ]
    return url


@pytest.fixture
def table(endpoint: AwsEndpoint) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    endpoint.client("dynamodb").create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def bodies(endpoint: AwsEndpoint, queue_url: str) -> set[str]:
    found: set[str] = set()
    while (
        messages := endpoint.client("sqs")
        .receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60)
        .get("Messages", [])
    ):
        found.update(m["Body"] for m in messages)
    return found


def entries(count: int) -> list[dict[str, str]]:
    return [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(count)]


def test_failed_entries_are_really_not_sent(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, queue: str
) -> None:
    faults = install(AwsFault(PartialBatch(0.5), Calls("sqs", frozenset({"SendMessageBatch"}))))
    sqs = handler_client("sqs", moto_server)

    response = sqs.send_message_batch(QueueUrl=queue, Entries=entries(6))

    failed = {f["Id"] for f in response["Failed"]}
    sent = {s["Id"] for s in response["Successful"]}
    assert len(failed) == 3
    assert sent == {str(i) for i in range(6)} - failed
    assert all(not f["SenderFault"] for f in response["Failed"])
    assert bodies(endpoint, queue) == {f"m{i}" for i in sent}
    assert faults.counts() == {"partialbatch sqs:SendMessageBatch@*": 1}


def test_a_batch_with_every_entry_failed_sends_nothing(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, queue: str
) -> None:
    install(AwsFault(PartialBatch(1.0), Calls("sqs", frozenset({"SendMessageBatch"}))))

    response = handler_client("sqs", moto_server).send_message_batch(
        QueueUrl=queue, Entries=entries(2)
    )

    assert {f["Id"] for f in response["Failed"]} == {"0", "1"}
    assert bodies(endpoint, queue) == set()


def test_failed_deletes_are_really_not_deleted(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, queue: str
) -> None:
    endpoint.client("sqs").send_message_batch(QueueUrl=queue, Entries=entries(2))
    received = endpoint.client("sqs").receive_message(
        QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0
    )["Messages"]
    install(AwsFault(PartialBatch(0.5), Calls("sqs", frozenset({"DeleteMessageBatch"}))))

    response = handler_client("sqs", moto_server).delete_message_batch(
        QueueUrl=queue,
        Entries=[{"Id": m["Body"], "ReceiptHandle": m["ReceiptHandle"]} for m in received],
    )

    assert [s["Id"] for s in response["Successful"]] != []
    assert bodies(endpoint, queue) == {f["Id"] for f in response["Failed"]}
    assert len(response["Failed"]) == 1


def test_unprocessed_items_are_really_not_written(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, table: str
) -> None:
    install(AwsFault(PartialBatch(0.5), Calls("dynamodb", frozenset({"BatchWriteItem"}))))
    items = [{"pk": {"S": f"k{i}"}} for i in range(4)]

    response = handler_client("dynamodb", moto_server).batch_write_item(
        RequestItems={table: [{"PutRequest": {"Item": i}} for i in items]}
    )

    unprocessed = {u["PutRequest"]["Item"]["pk"]["S"] for u in response["UnprocessedItems"][table]}
    stored = {i["pk"]["S"] for i in endpoint.client("dynamodb").scan(TableName=table)["Items"]}
    assert len(unprocessed) == 2
    assert stored == {f"k{i}" for i in range(4)} - unprocessed


def test_unprocessed_keys_are_really_not_read(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, table: str
) -> None:
    keys = [{"pk": {"S": f"k{i}"}} for i in range(4)]
    for key in keys:
        endpoint.client("dynamodb").put_item(TableName=table, Item=key)
    install(AwsFault(PartialBatch(0.25), Calls("dynamodb", frozenset({"BatchGetItem"}))))

    response = handler_client("dynamodb", moto_server).batch_get_item(
        RequestItems={table: {"Keys": keys, "ConsistentRead": True}}
    )

    read = {i["pk"]["S"] for i in response["Responses"][table]}
    unprocessed = response["UnprocessedKeys"][table]
    assert len(read) == 3
    assert {k["pk"]["S"] for k in unprocessed["Keys"]} == {f"k{i}" for i in range(4)} - read
    assert unprocessed["ConsistentRead"] is True


@pytest.mark.parametrize(
    ("action", "service", "code"),
    [
        (Throttle(), "sqs", "RequestThrottled"),
        (Throttle(), "dynamodb", "ProvisionedThroughputExceededException"),
        (ServerError(), "sqs", "InternalError"),
        (ServerError(), "dynamodb", "InternalServerError"),
    ],
)
def test_errors_are_the_services_own_and_retryable(
    *,
    install: Any,
    moto_server: MotoServer,
    queue: str,
    table: str,
    action: Throttle | ServerError,
    service: str,
    code: str,
) -> None:
    install(AwsFault(action, Calls(service)))
    client = handler_client(service, moto_server)
    call = (
        partial(client.get_queue_attributes, QueueUrl=queue)
        if service == "sqs"
        else partial(client.describe_table, TableName=table)
    )

    with pytest.raises(ClientError) as caught:
        call()

    assert caught.value.response["Error"]["Code"] == code
    assert is_retryable(caught.value)


def test_only_the_handlers_clients_are_hit(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, queue: str
) -> None:
    faults = install(AwsFault(Throttle(), Calls("sqs")))
    plain = boto3.client("sqs", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")

    plain.send_message(QueueUrl=queue, MessageBody="default session, no function")
    endpoint.client("sqs").send_message(QueueUrl=queue, MessageBody="the stack's own client")

    assert faults.counts() == {}


def test_functions_skip_and_limit_select_the_calls(
    install: Any, moto_server: MotoServer, queue: str
) -> None:
    faults = install(
        AwsFault(Throttle(), Calls("sqs", functions=frozenset({FUNCTION}), skip=1, limit=2))
    )
    mine = handler_client("sqs", moto_server)
    other = handler_client("sqs", moto_server, function="EmitterFunction")

    outcomes = []
    for _ in range(5):
        other.get_queue_attributes(QueueUrl=queue)
        try:
            mine.get_queue_attributes(QueueUrl=queue)
            outcomes.append("ok")
        except ClientError:
            outcomes.append("throttled")

    assert outcomes == ["ok", "throttled", "throttled", "ok", "ok"]
    assert faults.counts() == {f"throttle sqs:*@{FUNCTION}": 2}


def test_no_call_is_hit_outside_the_window(
    install: Any, moto_server: MotoServer, queue: str
) -> None:
    faults = install(AwsFault(Throttle(), Calls("sqs", window=(3600.0, 7200.0))))

    handler_client("sqs", moto_server).get_queue_attributes(QueueUrl=queue)

    assert faults.counts() == {}


def test_a_seeded_rate_is_reproducible(install: Any, moto_server: MotoServer, queue: str) -> None:
    def run() -> list[bool]:
        faults = install(AwsFault(Throttle(), Calls("sqs", rate=0.5)), seed=3)
        client = handler_client("sqs", moto_server)
        hits = []
        for _ in range(12):
            try:
                client.get_queue_attributes(QueueUrl=queue)
                hits.append(False)
            except ClientError:
                hits.append(True)
        faults.remove()
        return hits

    first = run()
    assert first == run()
    assert 0 < sum(first) < 12


def test_a_crash_after_a_call_dies_once_the_call_is_made(
    install: Any, moto_server: MotoServer, endpoint: AwsEndpoint, queue: str
) -> None:
    install(AwsFault(Crash(after_call=True), Calls("sqs", frozenset({"SendMessageBatch"}))))

    with pytest.raises(RuntimeCrash):
        handler_client("sqs", moto_server).send_message_batch(QueueUrl=queue, Entries=entries(2))

    assert bodies(endpoint, queue) == {"m0", "m1"}


def test_a_crash_escapes_the_handler_and_is_a_function_error() -> None:
    def handler(_event: Any, _context: Any) -> None:
        try:
            raise RuntimeCrash("process exit")
        except Exception:  # noqa: BLE001 (what the layer does with ordinary errors)
            pytest.fail("a crash must not be catchable as an Exception")

    invocation = LocalFunction.of(handler).environment().invoke({})

    assert invocation.crashed
    assert not invocation.ok
    assert invocation.describe_error()[0] == "Runtime.ExitError"


def test_a_skewed_clock_is_offered_to_the_skewed_function_only() -> None:
    faults = FaultPlan(clock_skew_ms={FUNCTION: -2000}).install()

    skewed = faults.handler_clock(FUNCTION)

    assert skewed is not None
    assert abs(skewed() - (time.time_ns() // 10**6 - 2000)) < 50
    assert faults.handler_clock("EmitterFunction") is None


def test_an_invocation_is_attributed_to_its_function() -> None:
    seen: list[str] = []
    function = LocalFunction(
        name="stack-EmitterFunction",
        logical_id="EmitterFunction",
        loader=lambda: lambda _event, _context: seen.append(current_function()),
    )

    function.environment().invoke({})

    assert seen == ["EmitterFunction"]
    assert current_function() == ""


class _Source:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


class _Stack:
    def __init__(self) -> None:
        self.timer = _Source()

    def source(self, function: str) -> _Source:
        assert function == "TimerFunction"
        return self.timer


def test_timed_faults_run_in_order_and_are_undone() -> None:
    stack = _Stack()
    faults = FaultPlan(timed=(PauseSource("TimerFunction", at=2.0, seconds=5.0),)).install()
    as_stack = cast(Stack, stack)

    faults.step(as_stack, 1.0)
    assert stack.timer.calls == []
    faults.step(as_stack, 2.5)
    assert stack.timer.calls == ["pause"]
    faults.restore(as_stack)
    faults.step(as_stack, 10.0)

    assert stack.timer.calls == ["pause", "resume"]
    assert faults.counts() == {"TimerFunction paused": 1}


def test_overrides_set_queue_properties_at_provisioning(
    fixture_template: Template, endpoint: AwsEndpoint, stack_name: str
) -> None:
    deployment = provision(
        fixture_template, stack_name, endpoint, overrides={"DelayQueue": {"VisibilityTimeout": 7}}
    )

    attributes = endpoint.client("sqs").get_queue_attributes(
        QueueUrl=deployment.resources["DelayQueue"].ref, AttributeNames=["VisibilityTimeout"]
    )["Attributes"]
    assert attributes["VisibilityTimeout"] == "7"
