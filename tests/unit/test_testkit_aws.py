"""The in-memory AWS clients (testkit.aws) answer the adapters' calls like moto does."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from delayq.buckets import bucket_key
from delayq.exceptions import WatermarkConflictError
from delayq.kafka import KafkaDelivery, OutRecord
from delayq.pending import PendingCounts, PendingTally
from delayq.records import CancelRequest
from delayq.retry import Backoff, Deadline
from delayq.store import MessageStore, Watermark, message_item
from testkit.aws import (
    FakeDynamoDB,
    FakeS3,
    FakeSqs,
    RequestCounter,
    as_dynamodb_client,
    item_size,
)
from testkit.clock import NOW_MS, FakeClock
from testkit.kafka import FakeProducer
from tests.factories import REGION, delay_request

TABLE = "bench-table"


def _create_table(client: Any) -> None:
    client.create_table(
        TableName=TABLE,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.fixture
def both_dynamodb() -> Iterator[tuple[Any, FakeDynamoDB]]:
    """(moto client, fake client), each with the same empty table."""
    with mock_aws():
        real = boto3.client("dynamodb", region_name=REGION)
        _create_table(real)
        fake = FakeDynamoDB()
        fake.create_table(TABLE)
        yield real, fake


@pytest.fixture
def both_sqs() -> Iterator[tuple[Any, FakeSqs]]:
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION), FakeSqs(clock=FakeClock())


def _code(call: Any) -> str:
    with pytest.raises(ClientError) as caught:
        call()
    return str(caught.value.response["Error"]["Code"])


def _put_all(client: Any, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), 25):
        chunk = items[start : start + 25]
        client.batch_write_item(RequestItems={TABLE: [{"PutRequest": {"Item": i}} for i in chunk]})


def _query(client: Any, pk: str, now_s: int, start: Any = None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "TableName": TABLE,
        "KeyConditionExpression": "pk = :pk",
        "FilterExpression": "#ttl > :now",
        "ExpressionAttributeNames": {"#ttl": "expires_at"},
        "ExpressionAttributeValues": {":pk": {"S": pk}, ":now": {"N": str(now_s)}},
    }
    if start:
        kwargs["ExclusiveStartKey"] = start
    return dict(client.query(**kwargs))


def _messages(n: int, pk_second: int = 1_795_249_000) -> list[dict[str, Any]]:
    items = []
    for i in range(n):
        request = delay_request(delay_id=f"id-{i:04d}", due_ms=pk_second * 1000 + i)
        item = message_item(request, 1, 86_400)
        if i % 3 == 0:  # expired: TTL has not removed it yet
            item["expires_at"] = {"N": str(NOW_MS // 1000 - 10)}
        items.append(item)
    return items


def test_query_with_ttl_filter_returns_what_moto_returns(
    both_dynamodb: tuple[Any, FakeDynamoDB],
) -> None:
    real, fake = both_dynamodb
    items = _messages(40)
    for client in (real, fake):
        _put_all(client, items)
    pk = items[0]["pk"]["S"]
    got_real = _query(real, pk, NOW_MS // 1000)
    got_fake = _query(fake, pk, NOW_MS // 1000)
    assert got_fake["Items"] == got_real["Items"]
    assert got_fake["Count"] == got_real["Count"] == 26
    assert (
        _query(fake, "nothing-here", 0)["Items"] == _query(real, "nothing-here", 0)["Items"] == []
    )


def test_query_pages_at_one_megabyte_like_moto(both_dynamodb: tuple[Any, FakeDynamoDB]) -> None:
    real, fake = both_dynamodb
    items = [
        {
            "pk": {"S": "p"},
            "sk": {"S": f"{i:05d}"},
            "v": {"B": b"x" * 4000},
            "expires_at": {"N": "9999999999"},
        }
        for i in range(400)
    ]
    for client in (real, fake):
        _put_all(client, items)
    for client in (real, fake):
        first = _query(client, "p", 0)
        assert "LastEvaluatedKey" in first
        assert 200 <= len(first["Items"]) <= 270
        seen = [i["sk"]["S"] for i in first["Items"]]
        start = first["LastEvaluatedKey"]
        while start:
            page = _query(client, "p", 0, start)
            seen += [i["sk"]["S"] for i in page["Items"]]
            start = page.get("LastEvaluatedKey")
        assert seen == [f"{i:05d}" for i in range(400)]


def test_batch_get_and_get_item_match_moto(both_dynamodb: tuple[Any, FakeDynamoDB]) -> None:
    real, fake = both_dynamodb
    items = [{"pk": {"S": "cancel#0"}, "sk": {"S": f"id-{i}"}, "x": {"N": "1"}} for i in range(5)]
    wanted = [{"pk": {"S": "cancel#0"}, "sk": {"S": f"id-{i}"}} for i in range(3, 9)]
    for client in (real, fake):
        _put_all(client, items)
    answers = [
        client.batch_get_item(RequestItems={TABLE: {"Keys": wanted, "ProjectionExpression": "sk"}})
        for client in (real, fake)
    ]
    as_sets = [sorted(i["sk"]["S"] for i in a["Responses"][TABLE]) for a in answers]
    assert as_sets[0] == as_sets[1] == ["id-3", "id-4"]
    assert all(set(i) == {"sk"} for a in answers for i in a["Responses"][TABLE])
    for key, present in ((wanted[0], True), (wanted[-1], False)):
        got = [
            client.get_item(TableName=TABLE, Key=key, ConsistentRead=True)
            for client in (real, fake)
        ]
        assert ("Item" in got[0]) is ("Item" in got[1]) is present
        if present:
            assert got[0]["Item"] == got[1]["Item"]


def test_conditional_update_and_errors_match_moto(both_dynamodb: tuple[Any, FakeDynamoDB]) -> None:
    real, fake = both_dynamodb
    key = {"pk": {"S": "meta#watermark"}, "sk": {"S": "-"}}

    def advance(client: Any, old: int | None, new: int) -> Any:
        values: dict[str, Any] = {":new": {"N": str(new)}, ":kind": {"S": "watermark"}}
        if old is not None:
            values[":old"] = {"N": str(old)}
        return lambda: client.update_item(
            TableName=TABLE,
            Key=key,
            UpdateExpression="SET #s = :new, kind = :kind",
            ConditionExpression="attribute_not_exists(pk)" if old is None else "#s = :old",
            ExpressionAttributeNames={"#s": "second"},
            ExpressionAttributeValues=values,
        )

    for client in (real, fake):
        advance(client, None, 10)()
        advance(client, 10, 11)()
    assert {_code(advance(c, None, 12)) for c in (real, fake)} == {
        "ConditionalCheckFailedException"
    }
    assert {_code(advance(c, 10, 12)) for c in (real, fake)} == {"ConditionalCheckFailedException"}
    stored = [c.get_item(TableName=TABLE, Key=key)["Item"] for c in (real, fake)]
    assert stored[0] == stored[1]
    assert stored[1]["second"] == {"N": "11"}
    duplicate = [{"PutRequest": {"Item": {**key, "x": {"S": "a"}}}}] * 2
    assert {
        _code(lambda c=c: c.batch_write_item(RequestItems={TABLE: duplicate})) for c in (real, fake)
    } == {"ValidationException"}
    assert {
        _code(lambda c=c: c.get_item(TableName="no-such-table", Key=key)) for c in (real, fake)
    } == {"ResourceNotFoundException"}


def test_transactions_and_their_cancellation_reasons_match_moto(
    both_dynamodb: tuple[Any, FakeDynamoDB],
) -> None:
    real, fake = both_dynamodb
    clock = {"pk": {"S": "clock#3"}, "sk": {"S": "-"}}
    marker = {"pk": {"S": "cancel#3"}, "sk": {"S": "r-1"}}

    def write(client: Any, seal_below: int, order: str) -> Any:
        return lambda: client.transact_write_items(
            TransactItems=[
                {
                    "ConditionCheck": {
                        "TableName": TABLE,
                        "Key": clock,
                        "ConditionExpression": "attribute_not_exists(#z) OR #z < :z",
                        "ExpressionAttributeNames": {"#z": "z"},
                        "ExpressionAttributeValues": {":z": {"N": str(seal_below)}},
                    }
                },
                {
                    "Update": {
                        "TableName": TABLE,
                        "Key": marker,
                        "UpdateExpression": "SET #o = :o",
                        "ConditionExpression": "attribute_not_exists(#o) OR #o <= :o",
                        "ExpressionAttributeNames": {"#o": "order"},
                        "ExpressionAttributeValues": {":o": {"S": order}},
                    }
                },
            ]
        )

    def reasons(call: Any) -> list[str]:
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == "TransactionCanceledException"
        return [r["Code"] for r in e.value.response["CancellationReasons"]]

    for client in (real, fake):
        write(client, 100, "b")()  # no clock item yet: the check holds
        client.put_item(TableName=TABLE, Item={**clock, "z": {"N": "100"}})
        assert reasons(write(client, 100, "c")) == ["ConditionalCheckFailed", "None"]
        assert reasons(write(client, 101, "a")) == ["None", "ConditionalCheckFailed"]
        write(client, 101, "c")()
    stored = [c.get_item(TableName=TABLE, Key=marker)["Item"] for c in (real, fake)]
    assert stored[0] == stored[1] == {**marker, "order": {"S": "c"}}


def test_pending_counts_behave_the_same_on_both(both_dynamodb: tuple[Any, FakeDynamoDB]) -> None:
    """ADD and SET in one update, the offset guard refusing a redelivery, the recount."""
    minute = NOW_MS // 60_000
    results = []
    for client in both_dynamodb:
        counts = PendingCounts(
            as_dynamodb_client(client), TABLE, backoff=Backoff(sleep=lambda _: None)
        )
        for offsets in (range(5), range(5), range(3, 8)):  # first, redelivered, re-batched
            tally = PendingTally()
            tally.kept(
                [
                    replace(
                        delay_request(
                            delay_id=f"id-{i}",
                            due_ms=NOW_MS + 60_000 * (i % 3),
                            src=f"delay-requests-0-{i}",
                        ),
                        ts_ms=NOW_MS,
                    )
                    for i in offsets
                ],
                queued=True,
            )
            counts.add(tally, Deadline.after(30))
        read = list(counts.read(minute, minute + 10, Deadline.after(30)))
        items = (
            client.scan(TableName=TABLE)["Items"]
            if hasattr(client, "scan")
            else client.items(TABLE)
        )
        results.append((read, sorted(map(str, items))))
    assert results[0] == results[1]
    assert sum(n.queued for n in results[0][0]) == 8


def test_message_store_behaves_the_same_on_both(both_dynamodb: tuple[Any, FakeDynamoDB]) -> None:
    deadline = Deadline.after(30)
    results = []
    for client in both_dynamodb:
        store = MessageStore(
            as_dynamodb_client(client),
            TABLE,
            shards=4,
            ttl_grace_seconds=86_400,
            max_delay_seconds=7 * 86_400,
            backoff=Backoff(sleep=lambda _: None),
        )
        requests = [delay_request(delay_id=f"m-{i}", due_ms=NOW_MS + 3_600_000) for i in range(30)]
        store.put_messages(requests, NOW_MS, deadline)
        store.put_cancels(
            [CancelRequest(i, "delay-requests-0-99", NOW_MS + 1) for i in ("m-1", "m-7", "other")],
            NOW_MS,
            deadline,
        )
        flags = store.cancelled(requests, NOW_MS, deadline)
        cancelled = {r.delay_id for r, flag in zip(requests, flags, strict=True) if flag}
        assert store.read_watermark(deadline) is None
        first = store.create_watermark(100, NOW_MS, deadline)
        with pytest.raises(WatermarkConflictError):
            store.create_watermark(90, NOW_MS, deadline)
        moved = store.write_watermark(first, Watermark(105, reading=110), NOW_MS, deadline)
        with pytest.raises(WatermarkConflictError):
            store.write_watermark(first, Watermark(106), NOW_MS, deadline)
        inside = store.write_watermark(
            moved, replace(moved, cursors={bucket_key(106, 0): "m-3"}), NOW_MS, deadline
        )
        with pytest.raises(WatermarkConflictError):  # a stale token inside the same second
            store.write_watermark(moved, replace(moved, cursors={}), NOW_MS, deadline)
        read = store.read_watermark(deadline)
        assert read is not None
        assert read.token == inside.token
        results.append((cancelled, (read.second, dict(read.cursors), read.reading)))
        store._pool.shutdown()
    assert results[0] == results[1] == ({"m-1", "m-7"}, (105, {bucket_key(106, 0): "m-3"}, 110))


@pytest.mark.parametrize(
    ("raw", "size"),
    [
        ("0", 2),
        ("7", 2),
        ("1000", 2),  # trailing zeros are not significant
        ("1234567", 5),  # one byte per two significant digits, plus one
        ("00012", 2),  # nor are leading ones
        ("-0012.3400", 3),
        ("+5", 2),
        ("1784000000123", 8),
    ],
)
def test_number_sizes_count_significant_digits(raw: str, size: int) -> None:
    assert item_size({"n": {"N": raw}}) == len("n") + size


def test_item_size_counts_names_in_utf8_bytes() -> None:
    item = {"pk": {"S": "p"}, "n\u00e9": {"N": "100"}, "b": {"B": b"xyz"}, "ok": {"BOOL": True}}
    assert item_size(item) == (2 + 1) + (3 + 2) + (1 + 3) + (2 + 1)


def test_capacity_units_follow_the_documented_rules() -> None:
    counter = RequestCounter()
    fake = FakeDynamoDB(counter)
    fake.create_table(TABLE)
    item = {"pk": {"S": "p"}, "sk": {"S": "s"}, "v": {"B": b"x" * 1100}}
    assert 1024 < item_size(item) < 2048
    fake.batch_write_item(RequestItems={TABLE: [{"PutRequest": {"Item": item}}]})
    assert counter.unit("dynamodb", "wru") == 2
    keys = [{"pk": {"S": "p"}, "sk": {"S": f"missing-{i}"}} for i in range(10)]
    fake.batch_get_item(RequestItems={TABLE: {"Keys": keys}})
    assert counter.unit("dynamodb", "rru") == 5.0  # 0.5 per key, found or not
    fake.get_item(TableName=TABLE, Key={"pk": {"S": "p"}, "sk": {"S": "s"}}, ConsistentRead=True)
    assert counter.unit("dynamodb", "rru") == 6.0
    assert counter.calls[("dynamodb", "BatchGetItem")] == 1


def test_sqs_batches_errors_and_deletes_match_moto(both_sqs: tuple[Any, FakeSqs]) -> None:
    real, fake = both_sqs
    urls = [c.create_queue(QueueName="bench-q")["QueueUrl"] for c in (real, fake)]
    entries: list[dict[str, Any]] = [  # SendMessageBatch's request JSON
        {"Id": str(i), "MessageBody": f"m{i}", "DelaySeconds": 0} for i in range(10)
    ]
    for client, url in zip((real, fake), urls, strict=True):
        sent = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert sorted(s["Id"] for s in sent["Successful"]) == sorted(e["Id"] for e in entries)
        assert not sent.get("Failed")
    for bad in (
        [*entries, {"Id": "x", "MessageBody": "m"}],
        [entries[0], entries[0]],
        [],
    ):
        codes = [
            _code(lambda c=c, u=u, b=bad: c.send_message_batch(QueueUrl=u, Entries=b))
            for c, u in zip((real, fake), urls, strict=True)
        ]
        assert codes[0] == codes[1]
    codes = [
        _code(lambda c=c, u=u: c.send_message_batch(QueueUrl=u + "-nope", Entries=entries[:1]))
        for c, u in zip((real, fake), urls, strict=True)
    ]
    assert codes[0] == codes[1]
    for client, url in zip((real, fake), urls, strict=True):
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        assert sorted(m["Body"] for m in got) == sorted(e["MessageBody"] for e in entries)
        answer = client.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": "ok", "ReceiptHandle": got[0]["ReceiptHandle"]},
                {"Id": "bad", "ReceiptHandle": "not-a-handle"},
            ],
        )
        assert [s["Id"] for s in answer["Successful"]] == ["ok"]
        assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [
            ("bad", "ReceiptHandleIsInvalid")
        ]
        assert (
            _code(
                lambda c=client, u=url: c.change_message_visibility(
                    QueueUrl=u, ReceiptHandle="not-a-handle", VisibilityTimeout=5
                )
            )
            == "ReceiptHandleIsInvalid"
        )


def test_fifo_deduplication_matches_moto(both_sqs: tuple[Any, FakeSqs]) -> None:
    real, fake = both_sqs
    for client in (real, fake):
        url = client.create_queue(QueueName="ticks.fifo", Attributes={"FifoQueue": "true"})[
            "QueueUrl"
        ]
        for body in ("a", "b"):
            client.send_message(
                QueueUrl=url, MessageBody=body, MessageGroupId="g", MessageDeduplicationId="tick-1"
            )
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        assert [m["Body"] for m in got] == ["a"]


def test_fake_sqs_honours_delay_and_visibility_on_its_clock() -> None:
    clock = FakeClock(NOW_MS)
    sqs = FakeSqs(clock=clock)
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "0", "MessageBody": "x", "DelaySeconds": 3}]
    )
    assert sqs.receive_message(QueueUrl=url) == {}
    clock.advance(3000)
    (message,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=10)["Messages"]
    assert sqs.receive_message(QueueUrl=url) == {}
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=1
    )
    clock.advance(1000)
    (again,) = sqs.receive_message(QueueUrl=url)["Messages"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    assert sqs.counter.calls[("sqs", "ReceiveMessage")] == 4


def test_s3_matches_moto() -> None:
    with mock_aws():
        real = boto3.client("s3", region_name=REGION)
        fake = FakeS3()
        for client in (real, fake):
            client.create_bucket(Bucket="bench-bucket")
            client.put_object(Bucket="bench-bucket", Key="k", Body=b"payload")
            assert client.get_object(Bucket="bench-bucket", Key="k")["Body"].read() == b"payload"
            client.delete_object(Bucket="bench-bucket", Key="k")
            client.delete_object(Bucket="bench-bucket", Key="k")  # a missing key is fine
        codes = [
            _code(lambda c=c: c.get_object(Bucket="bench-bucket", Key="k")) for c in (real, fake)
        ]
        assert codes == ["NoSuchKey", "NoSuchKey"]


def test_fake_producer_serves_delivery_reports() -> None:
    producer = FakeProducer(fail_topics=frozenset({"broken"}))
    delivery = KafkaDelivery(lambda _on_error: producer, 1.0)
    results = delivery.deliver(
        [
            OutRecord("orders.timeout", b"k", b"v", [("h", b"1")]),
            OutRecord("broken", None, b"v", []),
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert "UNKNOWN_TOPIC" in results[1].detail
    assert [r.topic for r in producer.produced] == ["orders.timeout"]
    assert producer.produced[0].header("h") == b"1"
