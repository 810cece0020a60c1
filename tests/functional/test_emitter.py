"""Emitter: never early, late by little, cancels dropped, failures reported item by item."""

from __future__ import annotations

import pytest

from delayq.contract import DelayRequest, Envelope
from delayq.payloads import payload_key
from tests.factories import NOW_MS, FakeProducer, SentEntry, kafka_event, kafka_record
from tests.functional.conftest import Pipeline


def entry(
    p: Pipeline, due_ms: int, delay_id: str = "d-1", target: str = "orders.timeout"
) -> SentEntry:
    request = DelayRequest(delay_id, target, due_ms, b"key", b"value", (("h", b"1"),), "t-0-1")
    return SentEntry(p.settings.delay_queue_url, Envelope(request).encode(), 0, p.clock())


def test_a_due_message_is_emitted_with_original_bytes_and_delivery_headers(p: Pipeline) -> None:
    result = p.emit([entry(p, NOW_MS - 5)], receive_count=2)
    assert result.failed == []
    [out] = p.producer.produced
    assert (out.topic, out.key, out.value) == ("orders.timeout", b"key", b"value")
    assert out.headers[0] == ("h", b"1")
    assert out.header("delay-id") == b"d-1"
    assert out.header("delay-due-ms") == str(NOW_MS - 5).encode()
    assert out.header("delay-emitted-ms") == str(NOW_MS).encode()
    assert out.header("delay-attempt") == b"2"


def test_an_early_message_is_held_until_due_never_emitted_before(p: Pipeline) -> None:
    due = NOW_MS + 1_700
    result = p.emit([entry(p, due)])
    assert p.producer.produced_at == [due]
    assert result.deliveries[0].lateness_ms == 0


def test_a_batch_is_emitted_in_due_order_each_at_its_time(p: Pipeline) -> None:
    dues = [NOW_MS + 900, NOW_MS + 100, NOW_MS + 2500]
    p.emit([entry(p, d, f"id-{i}") for i, d in enumerate(dues)])
    assert p.producer.produced_at == sorted(dues)
    assert all(at >= due for at, due in zip(p.producer.produced_at, sorted(dues), strict=True))


def test_a_message_too_early_to_hold_is_re_delayed_not_emitted(p: Pipeline) -> None:
    p.aws.sqs.send_message(QueueUrl=p.settings.delay_queue_url, MessageBody="x")
    [msg] = p.aws.sqs.receive_message(QueueUrl=p.settings.delay_queue_url)["Messages"]
    early = entry(p, NOW_MS + 60_000)
    result = p.emit([early], receipt_handles=[msg["ReceiptHandle"]])
    assert len(result.failed) == 1
    assert result.redelayed == 1
    assert p.producer.produced == []
    assert p.clock.slept == []


def test_cancelled_ids_are_dropped(p: Pipeline) -> None:
    p.ingest(kafka_event(kafka_record(cancel="d-2")))
    result = p.emit([entry(p, NOW_MS, "d-1"), entry(p, NOW_MS, "d-2")])
    assert [o.header("delay-id") for o in p.producer.produced] == [b"d-1"]
    assert result.cancelled == 1
    assert result.failed == []


def test_a_kafka_delivery_failure_fails_only_that_message(p: Pipeline) -> None:
    p.producer = FakeProducer(fail_topics={"orders.lost"}, clock=p.clock)
    p.settings = p.settings.with_overrides(allowed_targets=("orders.*",))
    batch = [entry(p, NOW_MS, "ok"), entry(p, NOW_MS, "bad", target="orders.lost")]
    result = p.emit(batch)
    assert len(result.failed) == 1
    assert result.failed[0].startswith("m-1-")
    assert [o.header("delay-id") for o in p.producer.produced] == [b"ok"]


@pytest.mark.parametrize(("receive_count", "back_off"), [(1, 2), (3, 8), (9, 60)])
def test_a_failed_delivery_comes_back_after_a_short_back_off_not_the_visibility_timeout(
    p: Pipeline, receive_count: int, back_off: int
) -> None:
    p.producer = FakeProducer(fail_topics={"orders.timeout"}, clock=p.clock)
    p.aws.sqs.send_message(QueueUrl=p.settings.delay_queue_url, MessageBody="x")
    [msg] = p.aws.sqs.receive_message(QueueUrl=p.settings.delay_queue_url)["Messages"]
    result = p.emit(
        [entry(p, NOW_MS)], receive_count=receive_count, receipt_handles=[msg["ReceiptHandle"]]
    )
    assert len(result.failed) == 1
    assert p.sqs.visibility_changes == [(msg["ReceiptHandle"], back_off)]


def test_no_delivery_report_before_the_timeout_fails_the_message(p: Pipeline) -> None:
    p.producer = FakeProducer(silent=True, clock=p.clock)
    result = p.emit([entry(p, NOW_MS)])
    assert len(result.failed) == 1
    assert "no delivery report" in result.errors[0]


def test_a_produce_refusal_fails_only_that_message(p: Pipeline) -> None:
    p.producer = FakeProducer(refuse=True, clock=p.clock)
    result = p.emit([entry(p, NOW_MS)])
    assert len(result.failed) == 1
    assert "produce refused" in result.errors[0]


def test_a_body_that_is_not_ours_goes_to_the_reject_queue(p: Pipeline) -> None:
    garbage = SentEntry(p.settings.delay_queue_url, "{not json", 0, p.clock())
    result = p.emit([garbage, entry(p, NOW_MS)])
    assert result.failed == []
    assert result.rejected == 1
    [reject] = p.aws.bodies(p.settings.reject_queue_url)
    assert reject["reason"] == "bad-envelope"
    assert reject["record"]["body"] == "{not json"
    assert len(p.producer.produced) == 1


def test_the_emitter_enforces_the_allow_list_again(p: Pipeline) -> None:
    result = p.emit([entry(p, NOW_MS, target="payments.capture")])
    assert p.producer.produced == []
    assert result.rejected == 1
    [reject] = p.aws.bodies(p.settings.reject_queue_url)
    assert reject["reason"] == "target-not-allowed"


def test_an_offloaded_value_is_restored_then_deleted_after_delivery(p: Pipeline) -> None:
    big = b"x" * (p.settings.offload_threshold_bytes + 1)
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="0", value=big)))
    [queued] = p.delayed()
    p.emit([queued])
    assert p.producer.produced[0].value == big
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="payloads/")
    assert listed.get("KeyCount", 0) == 0


def offloaded(p: Pipeline, delay_id: str, key: str) -> SentEntry:
    """A pointer body for ``delay_id`` whose value is said to be at ``key``."""
    ref = f"s3://{p.settings.payload_bucket}/{key}"
    request = DelayRequest(delay_id, "reminders", NOW_MS, None, None, (), "t-0-1", ref)
    return SentEntry(p.settings.delay_queue_url, Envelope(request).encode(), 0, p.clock())


def own_key(delay_id: str) -> str:
    return payload_key(DelayRequest(delay_id, "reminders", NOW_MS, None, None, (), "t-0-1"))


def test_a_missing_offloaded_value_fails_that_message_only(p: Pipeline) -> None:
    result = p.emit([offloaded(p, "gone", own_key("gone")), entry(p, NOW_MS)])
    assert len(result.failed) == 1
    assert "get payload" in result.errors[0]
    assert len(p.producer.produced) == 1


def test_a_pointer_to_another_message_payload_is_rejected_not_produced_nor_deleted(
    p: Pipeline,
) -> None:
    theirs = own_key("theirs")
    p.aws.s3.put_object(Bucket=p.settings.payload_bucket, Key=theirs, Body=b"secret")
    result = p.emit([offloaded(p, "forged", theirs), entry(p, NOW_MS)])
    assert result.failed == []
    assert result.rejected == 1
    [reject] = p.aws.bodies(p.settings.reject_queue_url)
    assert reject["reason"] == "bad-envelope"
    assert [o.header("delay-id") for o in p.producer.produced] == [b"d-1"]
    body = p.aws.s3.get_object(Bucket=p.settings.payload_bucket, Key=theirs)["Body"].read()
    assert body == b"secret"


@pytest.fixture
def p(pipeline: Pipeline) -> Pipeline:
    return pipeline


def test_deliveries_are_recorded_as_one_stats_item_per_minute(p: Pipeline) -> None:
    p.emit([entry(p, NOW_MS - 250, "a"), entry(p, NOW_MS, "b")])
    p.clock.advance(60_000)  # the minute is over: the next batch writes it
    p.emit([entry(p, p.clock(), "c")])
    items = p.aws.dynamodb.query(
        TableName=p.settings.table_name,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"stats#{NOW_MS // 60_000}"}},
    )["Items"]
    [item] = items
    orders = item["targets"]["M"]["orders.timeout"]["M"]
    assert orders["messages"]["N"] == "2"
    assert orders["late_max_ms"]["N"] == "250"
