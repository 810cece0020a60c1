"""The SQS adapters on moto: batches, per-entry retries, delays, tick de-duplication, rejects."""

from __future__ import annotations

import base64
import json
from typing import Any, cast

import pytest

from delayq import constants as c
from delayq.envelope import decode_body
from delayq.exceptions import QueueError, RetriesExhaustedError
from delayq.payloads import PayloadStore, parse_ref
from delayq.queues import DelayQueue, Outgoing, RejectQueue, SqsQueue, TickQueue
from delayq.records import Reason, Rejection
from delayq.retry import Deadline
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_record
from tests.factories import AwsResources, ClientProxy, client_error, delay_request


def deadline() -> Deadline:
    return Deadline.after(60)


def recording(aws: AwsResources, **overrides: Any) -> ClientProxy:
    """The moto SQS client, with every SendMessageBatch call recorded."""
    overrides.setdefault("send_message_batch", aws.sqs.send_message_batch)
    return ClientProxy(aws.sqs, **overrides)


def batch_entries(proxy: ClientProxy) -> list[list[dict[str, Any]]]:
    return [kw["Entries"] for name, kw in proxy.calls if name == "send_message_batch"]


class AcceptingSqs:
    """An SQS client that takes every batch entry and keeps what it was sent."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:  # noqa: N803 -- boto3's names
        self.batches.append(Entries)
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}


def reject_url(aws: AwsResources) -> str:
    return aws.settings.reject_queue_url


# --- SqsQueue ----------------------------------------------------------------------------------


def test_entries_are_sent_in_batches_of_10(aws: AwsResources) -> None:
    proxy = recording(aws)
    queue = SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff())
    queue.send("op", [Outgoing(f"m{i}") for i in range(25)], deadline())
    assert [len(e) for e in batch_entries(proxy)] == [10, 10, 5]
    assert sorted(m["Body"] for m in aws.receive_all(reject_url(aws))) == sorted(
        f"m{i}" for i in range(25)
    )


def test_no_entries_send_nothing(aws: AwsResources) -> None:
    proxy = recording(aws)
    SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff()).send("op", [], deadline())
    assert proxy.calls == []


def test_large_entries_are_split_so_a_batch_stays_within_the_size_limit(
    aws: AwsResources,
) -> None:
    proxy = recording(aws)
    queue = SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff())
    bodies = [f"{i}" + "x" * 200_000 for i in range(10)]
    queue.send("op", [Outgoing(b) for b in bodies], deadline())
    sizes = [sum(len(e["MessageBody"]) for e in entries) for entries in batch_entries(proxy)]
    assert max(sizes) <= c.SQS_MAX_MESSAGE_BYTES
    assert sorted(m["Body"] for m in aws.receive_all(reject_url(aws))) == sorted(bodies)


def test_a_batch_holds_entries_up_to_exactly_the_size_limit(aws: AwsResources) -> None:
    proxy = recording(aws)
    half = c.SQS_MAX_BATCH_BYTES // 2
    bodies = [str(i) * half for i in range(3)]
    SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff()).send(
        "op", [Outgoing(b) for b in bodies], deadline()
    )
    assert [[e["MessageBody"] for e in entries] for entries in batch_entries(proxy)] == [
        bodies[:2],
        bodies[2:],
    ]


def test_only_the_failed_entries_are_sent_again(aws: AwsResources) -> None:
    def send_message_batch(**kwargs: Any) -> Any:
        if len(proxy.calls) > 1:
            return aws.sqs.send_message_batch(**kwargs)
        taken = [e for e in kwargs["Entries"] if e["Id"] not in {"1", "3"}]
        response = aws.sqs.send_message_batch(QueueUrl=kwargs["QueueUrl"], Entries=taken)
        response["Failed"] = [
            {"Id": i, "SenderFault": False, "Code": "InternalError", "Message": "try again"}
            for i in ("1", "3")
        ]
        return response

    proxy = recording(aws, send_message_batch=send_message_batch)
    queue = SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff())
    queue.send("op", [Outgoing(f"m{i}") for i in range(5)], deadline())
    retried = batch_entries(proxy)[1]
    assert [(e["Id"], e["MessageBody"]) for e in retried] == [("1", "m1"), ("3", "m3")]
    assert sorted(m["Body"] for m in aws.receive_all(reject_url(aws))) == [
        f"m{i}" for i in range(5)
    ]


def test_entries_failing_every_time_raise_with_the_unsent_entries(aws: AwsResources) -> None:
    def send_message_batch(**kwargs: Any) -> Any:
        return {
            "Successful": [],
            "Failed": [
                {"Id": e["Id"], "SenderFault": False, "Code": "InternalError"}
                for e in kwargs["Entries"]
            ],
        }

    proxy = recording(aws, send_message_batch=send_message_batch)
    queue = SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff(2))
    with pytest.raises(RetriesExhaustedError) as caught:
        queue.send("send to reject queue", [Outgoing("a"), Outgoing("b")], deadline())
    unsent = cast("list[tuple[int, Outgoing]]", caught.value.unsent)
    assert [o.body for _, o in unsent] == ["a", "b"]
    assert len(proxy.calls) == 2


def test_an_entry_failing_by_the_senders_fault_is_not_retried(aws: AwsResources) -> None:
    def send_message_batch(**kwargs: Any) -> Any:
        return {
            "Successful": [],
            "Failed": [
                {
                    "Id": "0",
                    "SenderFault": True,
                    "Code": "InvalidParameterValue",
                    "Message": "bad body",
                }
            ],
        }

    proxy = recording(aws, send_message_batch=send_message_batch)
    queue = SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff())
    with pytest.raises(QueueError, match=r"SQS refused 1 entr.*bad body"):
        queue.send("op", [Outgoing("a")], deadline())
    assert len(proxy.calls) == 1


def test_a_throttled_batch_is_sent_again(aws: AwsResources) -> None:
    def send_message_batch(**kwargs: Any) -> Any:
        if len(proxy.calls) == 1:
            raise client_error("RequestThrottled")
        return aws.sqs.send_message_batch(**kwargs)

    proxy = recording(aws, send_message_batch=send_message_batch)
    SqsQueue(as_sqs_client(proxy), reject_url(aws), no_sleep_backoff()).send(
        "op", [Outgoing("a")], deadline()
    )
    assert [m["Body"] for m in aws.receive_all(reject_url(aws))] == ["a"]


def test_a_missing_queue_is_a_queue_error(aws: AwsResources) -> None:
    url = reject_url(aws).replace("delayq-reject", "no-such-queue")
    with pytest.raises(QueueError, match=r"SendMessageBatch to .*no-such-queue failed"):
        SqsQueue(aws.sqs, url, no_sleep_backoff()).send("op", [Outgoing("a")], deadline())


def test_change_visibility_hides_a_received_message(aws: AwsResources) -> None:
    url = reject_url(aws)
    aws.sqs.send_message(QueueUrl=url, MessageBody="early")
    message = aws.sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]
    SqsQueue(aws.sqs, url, no_sleep_backoff()).change_visibility(
        message["ReceiptHandle"], 300, deadline()
    )
    assert aws.sqs.receive_message(QueueUrl=url).get("Messages", []) == []


def test_change_visibility_of_an_unknown_receipt_is_a_queue_error(aws: AwsResources) -> None:
    queue = SqsQueue(aws.sqs, reject_url(aws), no_sleep_backoff())
    with pytest.raises(QueueError, match="ChangeMessageVisibility failed"):
        queue.change_visibility("not-a-receipt-handle", 30, deadline())


# --- DelayQueue --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait_ms", "lead_ms", "delay_seconds"),
    [
        (-5000, 1000, 0),
        (999, 0, 0),
        (1500, 1000, 0),
        (5999, 1000, 4),
        (6000, 1000, 5),
        (6000, 0, 6),
        (899_999, 0, 899),
        (900_000, 0, 900),
        (900_000, 1000, 899),
    ],
)
def test_delay_seconds_round_down_so_the_queue_releases_at_or_before_due(
    wait_ms: int, lead_ms: int, delay_seconds: int
) -> None:
    sqs = AcceptingSqs()
    queue = DelayQueue(
        SqsQueue(as_sqs_client(sqs), "https://sqs/delay", no_sleep_backoff()), lead_ms
    )
    queue.send([delay_request(due_ms=NOW_MS + wait_ms)], NOW_MS, deadline())
    (entry,) = sqs.batches[0]
    assert entry["DelaySeconds"] == delay_seconds
    assert NOW_MS + entry["DelaySeconds"] * 1000 <= max(NOW_MS, NOW_MS + wait_ms - lead_ms)


def test_delay_queue_bodies_carry_every_request_once(aws: AwsResources) -> None:
    requests = [delay_request(delay_id=f"order-{i}", due_ms=NOW_MS - i) for i in range(12)]
    url = aws.settings.delay_queue_url
    DelayQueue(SqsQueue(aws.sqs, url, no_sleep_backoff()), 1000).send(requests, NOW_MS, deadline())
    received = [
        e.request
        for m in aws.receive_all(url)
        for e in decode_body(m["Body"])
        if e.request is not None
    ]
    assert sorted(received, key=lambda r: r.delay_id) == sorted(requests, key=lambda r: r.delay_id)


def test_a_delayed_message_is_not_visible_yet(aws: AwsResources) -> None:
    url = aws.settings.delay_queue_url
    queue = DelayQueue(SqsQueue(aws.sqs, url, no_sleep_backoff()), 0)
    queue.send([delay_request(due_ms=NOW_MS + 600_000)], NOW_MS, deadline())
    attributes = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (
        attributes["ApproximateNumberOfMessages"],
        attributes["ApproximateNumberOfMessagesDelayed"],
    ) == (
        "0",
        "1",
    )


# --- TickQueue ---------------------------------------------------------------------------------


def tick_queue(aws: AwsResources) -> TickQueue:
    return TickQueue(aws.sqs, aws.settings.tick_queue_url, no_sleep_backoff())


def test_two_ticks_of_one_period_are_one_fifo_message(aws: AwsResources) -> None:
    ticks = tick_queue(aws)
    assert ticks.put_tick(29_920_800, 60, NOW_MS, deadline()) == "tick-29920800"
    assert ticks.put_tick(29_920_800, 60, NOW_MS + 40_000, deadline()) == "tick-29920800"
    assert aws.bodies(aws.settings.tick_queue_url) == [
        {"tick": 29_920_800, "tick_seconds": 60, "at_ms": NOW_MS}
    ]


def test_ticks_of_two_periods_are_two_messages_in_order(aws: AwsResources) -> None:
    ticks = tick_queue(aws)
    ticks.put_tick(29_920_800, 60, NOW_MS, deadline())
    ticks.put_tick(29_920_801, 60, NOW_MS + 60_000, deadline())
    messages = aws.receive_all(aws.settings.tick_queue_url)
    assert [json.loads(m["Body"])["tick"] for m in messages] == [29_920_800, 29_920_801]
    assert {m["Attributes"]["MessageGroupId"] for m in messages} == {"ticks"}


def test_a_tick_to_a_missing_queue_is_a_queue_error(aws: AwsResources) -> None:
    url = aws.settings.tick_queue_url.replace("delayq-tick", "no-such")
    with pytest.raises(QueueError, match="sending tick tick-7 failed"):
        TickQueue(aws.sqs, url, no_sleep_backoff()).put_tick(7, 60, NOW_MS, deadline())


def test_a_throttled_tick_is_sent_again(aws: AwsResources) -> None:
    def send_message(**kwargs: Any) -> Any:
        if len(proxy.calls) == 1:
            raise client_error("ThrottlingException")
        return aws.sqs.send_message(**kwargs)

    proxy = ClientProxy(aws.sqs, send_message=send_message)
    TickQueue(as_sqs_client(proxy), aws.settings.tick_queue_url, no_sleep_backoff()).put_tick(
        1, 60, NOW_MS, deadline()
    )
    assert len(aws.bodies(aws.settings.tick_queue_url)) == 1


# --- RejectQueue -------------------------------------------------------------------------------


def reject_queue(aws: AwsResources) -> RejectQueue:
    payloads = PayloadStore(aws.s3, aws.settings.payload_bucket, no_sleep_backoff())
    return RejectQueue(SqsQueue(aws.sqs, reject_url(aws), no_sleep_backoff()), payloads)


def rejection(record: Any) -> Rejection:
    return Rejection(Reason.MISSING_TARGET, "header delay-target is missing", record, "t", 2, 9)


def test_a_reject_body_keeps_reason_coordinates_and_the_original_record(
    aws: AwsResources,
) -> None:
    record = kafka_record(partition=2, offset=9, headers=[{"odd": None}], seconds="1")
    reject_queue(aws).send([rejection(record)], NOW_MS, deadline())
    assert aws.bodies(reject_url(aws)) == [
        {
            "reason": "missing-target",
            "detail": "header delay-target is missing",
            "source": {"topic": "t", "partition": 2, "offset": 9},
            "record": record,
            "record_ref": None,
            "rejected_ms": NOW_MS,
        }
    ]


def test_a_reject_without_coordinates_has_null_source(aws: AwsResources) -> None:
    bad = Rejection(Reason.MALFORMED_RECORD, "record is not an object", "junk", None, None, None)
    reject_queue(aws).send([bad], NOW_MS, deadline())
    (body,) = aws.bodies(reject_url(aws))
    assert (body["source"], body["record"]) == (
        {"topic": None, "partition": None, "offset": None},
        "junk",
    )


def test_an_oversize_record_goes_to_s3_and_the_body_points_at_it(aws: AwsResources) -> None:
    value = bytes(range(256)) * 1200  # 300 KiB, more than an SQS body holds once in base64
    record = kafka_record(partition=2, offset=9, value=value)
    reject_queue(aws).send([rejection(record)], NOW_MS, deadline())
    (body,) = aws.bodies(reject_url(aws))
    assert (body["record"], body["reason"]) == (None, "missing-target")
    bucket, key = parse_ref(body["record_ref"])
    stored = aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert json.loads(stored) == record
    assert base64.b64decode(json.loads(stored)["value"]) == value


def test_rejects_of_a_batch_are_all_sent(aws: AwsResources) -> None:
    records = [kafka_record(offset=i) for i in range(13)]
    reject_queue(aws).send([rejection(r) for r in records], NOW_MS, deadline())
    assert sorted(b["record"]["offset"] for b in aws.bodies(reject_url(aws))) == list(range(13))


def test_batches_are_sent_concurrently_and_a_failure_is_raised_after_all_finished(
    aws: AwsResources,
) -> None:
    calls: list[int] = []

    def send_message_batch(**kwargs: Any) -> dict[str, Any]:
        calls.append(len(kwargs["Entries"]))
        if kwargs["Entries"][0]["MessageBody"] == "fails":
            raise QueueError("simulated refusal")
        return cast(dict[str, Any], aws.sqs.send_message_batch(**kwargs))

    queue = SqsQueue(
        as_sqs_client(ClientProxy(aws.sqs, send_message_batch=send_message_batch)),
        aws.settings.delay_queue_url,
    )
    entries = [Outgoing("fails")] + [Outgoing(f"m{i}") for i in range(29)]
    with pytest.raises(QueueError, match="simulated refusal"):
        queue.send("send", entries, deadline())
    assert sorted(calls) == [10, 10, 10]
    assert aws.visible_and_delayed(aws.settings.delay_queue_url) == 20
