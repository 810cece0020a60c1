"""`delayq_local.moto_fixes`: what the changes do on the embedded server, and, against plain moto
in a fresh process, whether the installed moto still needs each of them.

When a "still needs" test fails after a moto upgrade, moto now does that part itself: remove
the matching change from moto_fixes (and this test), then set `moto_fixes.WRITTEN_FOR`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from functools import cache
from importlib.metadata import version
from typing import Any

import pytest
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models import dynamo_type
from moto.dynamodb.models import table as dynamodb_table
from moto.sqs import models as sqs_models

from delayq_local import AwsEndpoint, LocalStackError, MotoServer, moto_fixes
from delayq_local.aws import DEFAULT_ACCOUNT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Facts about plain moto, gathered in a process where moto_fixes was never applied.
PLAIN_MOTO = """
import inspect
import json

import boto3
from moto import mock_aws
from moto.core import utils
from moto.sqs import models

facts = {"unix_time_through_datetime": models.unix_time is utils.unix_time
         and "datetime" in inspect.getsource(utils.unix_time)}
with mock_aws():
    sqs = boto3.client("sqs", region_name="us-east-1", aws_access_key_id="k",
                       aws_secret_access_key="s")
    fifo = sqs.create_queue(QueueName="q.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]

    def send(body):
        sqs.send_message(QueueUrl=fifo, MessageBody=body, MessageGroupId="g",
                         MessageDeduplicationId="same")

    send("first")
    (first,) = sqs.receive_message(QueueUrl=fifo)["Messages"]
    sqs.delete_message(QueueUrl=fifo, ReceiptHandle=first["ReceiptHandle"])
    send("again")
    facts["fifo_duplicate_accepted_after_delete"] = bool(
        sqs.receive_message(QueueUrl=fifo).get("Messages"))

    plain = sqs.create_queue(QueueName="plain")["QueueUrl"]
    for i in range(20):
        sqs.send_message(QueueUrl=plain, MessageBody=str(i))
    builds = []
    original = models.SQSBackend.get_queue_attributes

    def counted(self, *args, **kwargs):
        builds.append(1)
        return original(self, *args, **kwargs)

    models.SQSBackend.get_queue_attributes = counted
    received = sqs.receive_message(QueueUrl=plain, MaxNumberOfMessages=10)["Messages"]
    facts["attribute_builds_per_received_message"] = len(builds) / len(received)

    from moto.dynamodb.models import table as ddb_table
    ddb = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="k",
                       aws_secret_access_key="s")
    ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                {"AttributeName": "sk", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                           {"AttributeName": "sk", "AttributeType": "S"}])
    for i in range(100):
        ddb.put_item(TableName="t", Item={"pk": {"S": f"p{i % 10}"}, "sk": {"S": str(i)}})
    listed = []
    original_all = ddb_table.Table.all_items

    def counted_all(self):
        items = original_all(self)
        listed.append(len(items))
        return items

    ddb_table.Table.all_items = counted_all
    ddb.query(TableName="t", KeyConditionExpression="pk = :p",
              ExpressionAttributeValues={":p": {"S": "p3"}})
    facts["items_listed_per_table_key_query"] = max(listed, default=0)

from moto.dynamodb import models as ddb_models
source = inspect.getsource(ddb_models.DynamoDBBackend.update_item)
# A missing item is stored bare (put_item), then updated: two steps, no lock around them.
facts["update_of_new_item_in_two_steps"] = (
    "table.put_item(data)" in source and "lock" not in source.lower()
)
print(json.dumps(facts))
"""


@cache
def plain_moto() -> dict[str, Any]:
    done = subprocess.run(  # noqa: S603 (this interpreter, a fixed script)
        [sys.executable, "-c", PLAIN_MOTO], capture_output=True, text=True, check=True, timeout=60
    )
    facts: dict[str, Any] = json.loads(done.stdout)
    return facts


def test_the_installed_moto_is_the_one_the_fixes_were_written_for() -> None:
    assert version("moto") == moto_fixes.WRITTEN_FOR


def test_another_moto_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moto_fixes, "version", lambda _name: "99.0.0")

    with pytest.raises(LocalStackError, match=r"moto 99\.0\.0 is installed"):
        moto_fixes.apply()


def test_moto_still_forgets_a_fifo_deduplication_id_once_the_message_is_deleted() -> None:
    # SQS keeps the id for 5 minutes after the first send, deleted or not.
    assert plain_moto()["fifo_duplicate_accepted_after_delete"]


def test_moto_still_builds_every_queue_attribute_to_check_each_message_retention() -> None:
    # Three of those attributes count the whole queue: receives slow down with queue depth.
    assert plain_moto()["attribute_builds_per_received_message"] >= 1


def test_moto_still_lists_the_whole_table_for_a_query_on_its_key() -> None:
    # 100 items in 10 partitions: a Query of one partition lists all 100 (and sorts them).
    assert plain_moto()["items_listed_per_table_key_query"] == 100


def test_moto_still_computes_now_through_datetime_arithmetic() -> None:
    assert plain_moto()["unix_time_through_datetime"]


def test_moto_still_updates_a_new_item_in_two_unguarded_steps() -> None:
    # A concurrent reader can see the bare key; DynamoDB's writes are atomic.
    assert plain_moto()["update_of_new_item_in_two_steps"]


def test_the_moto_server_has_the_fixes_applied(moto_server: MotoServer) -> None:
    assert moto_fixes.applied()
    assert vars(sqs_models)["unix_time_millis"] is moto_fixes._unix_time_millis
    assert dynamodb_table.Table.query.__qualname__.startswith("_scoped_query")
    for name in moto_fixes.ATOMIC_DYNAMODB_OPERATIONS:
        operation = getattr(dynamodb_models.DynamoDBBackend, name)
        assert operation.__qualname__.startswith("_atomic"), name


def test_a_conditional_create_is_one_atomic_step(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Racing creators (ingest's first watermark) and readers: one creator wins, and no reader
    # ever sees the item without the attribute the create writes. moto's window between
    # storing the bare key and updating it is widened, so that plain moto fails every time.
    store = dynamodb_table.Table.put_item

    def slow_bare_put(table: Any, attributes: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        stored = store(table, attributes, *args, **kwargs)
        if len(attributes) == 1:  # the key only: update_item's first step
            time.sleep(0.02)
        return stored

    monkeypatch.setattr(dynamodb_table.Table, "put_item", slow_bare_put)
    ddb = AwsEndpoint(moto_server.endpoint_url).client("dynamodb")
    table = f"atomic-{time.monotonic_ns()}"
    ddb.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
    )
    won: list[int] = []
    partial: list[dict[str, Any]] = []

    def create(index: int) -> None:
        try:
            ddb.update_item(
                TableName=table,
                Key={"pk": {"S": f"k{index // 8}"}},
                UpdateExpression="SET #s = :s",
                ExpressionAttributeNames={"#s": "second"},
                ConditionExpression="attribute_not_exists(pk)",
                ExpressionAttributeValues={":s": {"N": str(index)}},
            )
            won.append(index)
        except ddb.exceptions.ConditionalCheckFailedException:
            pass

    def read(index: int) -> None:
        for _ in range(20):
            item = ddb.get_item(
                TableName=table, Key={"pk": {"S": f"k{index // 8}"}}, ConsistentRead=True
            ).get("Item")
            if item is not None and "second" not in item:
                partial.append(item)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(64) for job in (create, read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert partial == []
    assert sorted(i // 8 for i in won) == list(range(8))  # one winner per item


def test_moto_keeps_its_retention_semantics_with_the_fixes(
    moto_server: MotoServer, endpoint: AwsEndpoint, stack_name: str
) -> None:
    sqs = endpoint.client("sqs")
    url = sqs.create_queue(QueueName=stack_name, Attributes={"MessageRetentionPeriod": "60"})[
        "QueueUrl"
    ]
    sqs.send_message(QueueUrl=url, MessageBody="new")
    sqs.send_message(QueueUrl=url, MessageBody="old")
    backend = sqs_models.sqs_backends[DEFAULT_ACCOUNT]["us-east-1"]
    old = backend.get_queue(stack_name)._messages[1]
    vars(old)["sent_timestamp"] = int(old.sent_timestamp or 0) - 61_000  # sent 61 s earlier

    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]

    assert [m["Body"] for m in received] == ["new"]
    assert abs(vars(sqs_models)["unix_time"]() - time.time()) < 1


def test_fifo_deduplication_lasts_five_minutes_even_after_a_delete(
    moto_server: MotoServer, endpoint: AwsEndpoint, stack_name: str
) -> None:
    sqs = endpoint.client("sqs")
    url = sqs.create_queue(QueueName=f"{stack_name}.fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]

    def send(body: str, dedup: str) -> None:
        sqs.send_message(
            QueueUrl=url, MessageBody=body, MessageGroupId="ticks", MessageDeduplicationId=dedup
        )

    def receive() -> list[str]:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        for m in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return [m["Body"] for m in messages]

    send("first", "tick-1")
    assert receive() == ["first"]
    send("again", "tick-1")  # deleted already, but within 5 minutes: a duplicate
    send("next", "tick-2")

    assert receive() == ["next"]


def test_queries_answer_as_before_with_the_fixes(
    moto_server: MotoServer, endpoint: AwsEndpoint, stack_name: str
) -> None:
    ddb = endpoint.client("dynamodb")
    ddb.create_table(
        TableName=stack_name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "g", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-g",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    for i in range(60):
        item = {"pk": {"S": f"p{i % 3}"}, "sk": {"S": f"{i:03d}"}, "g": {"S": f"g{i % 2}"}}
        ddb.put_item(TableName=stack_name, Item=item)

    def query(**kwargs: Any) -> list[str]:
        keys: list[str] = []
        start: dict[str, Any] = {}
        while True:
            page = ddb.query(TableName=stack_name, Limit=7, **kwargs, **start)
            keys += [f"{i['pk']['S']}/{i['sk']['S']}" for i in page["Items"]]
            if "LastEvaluatedKey" not in page:
                return keys
            start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}

    one = {":p": {"S": "p1"}}
    assert query(KeyConditionExpression="pk = :p", ExpressionAttributeValues=one) == [
        f"p1/{i:03d}" for i in range(1, 60, 3)
    ]
    assert query(
        KeyConditionExpression="pk = :p", ExpressionAttributeValues=one, ScanIndexForward=False
    ) == [f"p1/{i:03d}" for i in reversed(range(1, 60, 3))]
    assert query(
        KeyConditionExpression="pk = :p AND sk > :s",
        ExpressionAttributeValues={**one, ":s": {"S": "040"}},
    ) == [f"p1/{i:03d}" for i in range(43, 60, 3)]
    assert (
        query(KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "x"}}) == []
    )
    # An index query and a scan still see every partition.
    assert (
        len(
            query(
                IndexName="by-g",
                KeyConditionExpression="g = :g",
                ExpressionAttributeValues={":g": {"S": "g0"}},
            )
        )
        == 30
    )
    assert ddb.scan(TableName=stack_name)["Count"] == 60


def pk_sk_table(ddb: Any, name: str, sort_key_type: str) -> None:
    """An on-demand table keyed by a string ``pk`` and a ``sk`` of ``sort_key_type``."""
    ddb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": sort_key_type},
        ],
    )


def test_a_scan_does_not_hold_up_the_other_item_operations(
    moto_server: MotoServer, endpoint: AwsEndpoint, stack_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DynamoDB's Scan never holds up writes (the TTL emulator scans the whole table every few
    # seconds). The scan is stopped on its first item until a write of another thread is
    # done: under a table-wide lock that write could not be, and the scan would give up.
    ddb = endpoint.client("dynamodb")
    pk_sk_table(ddb, stack_name, "S")
    for i in range(30):
        ddb.put_item(TableName=stack_name, Item={"pk": {"S": f"p{i % 3}"}, "sk": {"S": f"{i:02d}"}})
    scanning, written = threading.Event(), threading.Event()
    waited: list[bool] = []
    within = dynamo_type.Item.is_within_segment

    def held(item: Any, segments: Any) -> bool:
        if not scanning.is_set():
            scanning.set()
            waited.append(written.wait(5))
        return bool(within(item, segments))

    monkeypatch.setattr(dynamo_type.Item, "is_within_segment", held)

    def write() -> None:
        scanning.wait(5)
        ddb.update_item(
            TableName=stack_name,
            Key={"pk": {"S": "p0"}, "sk": {"S": "00"}},
            UpdateExpression="SET #n = :n",
            ExpressionAttributeNames={"#n": "n"},
            ExpressionAttributeValues={":n": {"N": "1"}},
        )
        written.set()

    writer = threading.Thread(target=write)
    writer.start()
    keys: list[str] = []
    start: dict[str, Any] = {}
    while True:
        page = ddb.scan(TableName=stack_name, Limit=7, **start)
        keys += [f"{i['pk']['S']}/{i['sk']['S']}" for i in page["Items"]]
        if "LastEvaluatedKey" not in page:
            break
        start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}
    writer.join()

    assert waited == [True]
    # Every item once, in moto's order (partition, then sort key), across pages.
    assert keys == sorted(f"p{i % 3}/{i:02d}" for i in range(30))


def test_a_scan_sorts_the_table_on_the_key_values(
    moto_server: MotoServer, endpoint: AwsEndpoint, stack_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sorting 21,000 DynamoType keys through their Python comparisons took 1.6 s a Scan page
    # on a busy machine; on their values, 60 ms (same order: DynamoType compares its values).
    ddb = endpoint.client("dynamodb")
    pk_sk_table(ddb, stack_name, "N")
    for i in range(40):
        ddb.put_item(TableName=stack_name, Item={"pk": {"S": f"p{i % 4}"}, "sk": {"N": str(i)}})
    compared: list[str] = []
    less = dynamo_type.DynamoType.__lt__

    def counted(a: Any, b: Any) -> bool:
        compared.append("<")
        return bool(less(a, b))

    monkeypatch.setattr(dynamo_type.DynamoType, "__lt__", counted)

    items = ddb.scan(TableName=stack_name)["Items"]

    assert compared == []
    # Numbers in numeric order (9 before 10), partitions in key order.
    assert [(i["pk"]["S"], int(i["sk"]["N"])) for i in items] == sorted(
        (f"p{i % 4}", i) for i in range(40)
    )
