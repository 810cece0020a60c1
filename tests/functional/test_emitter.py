"""Emitter: never early, late by little, cancels dropped, failures settled message by message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from delayq import buckets, constants
from delayq.envelope import Envelope, dead_letter_of, decode_body
from delayq.payloads import PayloadStore, payload_key
from delayq.queues import DelayQueue, SqsQueue
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.stats import DeliveryStats, FlushPolicy
from testkit.aws import as_s3_client, as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_event, kafka_record
from testkit.kafka import DeliveryCallback, FakeProducer
from tests.factories import ClientProxy, SentEntry, client_error
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


def test_the_emitter_reads_only_the_markers_a_control_may_apply_to(p: Pipeline) -> None:
    # A running stack: its control clocks exist since yesterday.
    p.store.control_clocks(range(p.settings.shards), NOW_MS - 86_400_000, p.deadline())
    p.ingest(kafka_event(kafka_record(cancel="d-2", timestamp=NOW_MS)))
    proxy = ClientProxy(p.aws.dynamodb, batch_get_item=p.aws.dynamodb.batch_get_item)
    q = p.with_store_client(proxy)

    def written_at(delay_id: str, ts_ms: int) -> SentEntry:
        request = DelayRequest(
            delay_id, "orders.timeout", NOW_MS, b"key", b"value", (), f"t-1-{ts_ms}", ts_ms=ts_ms
        )
        return SentEntry(p.settings.delay_queue_url, Envelope(request).encode(), 0, p.clock())

    # d-2 was written before its cancel: cancelled. d-1 and d-3 seconds after it: new messages.
    batch = [written_at("d-1", NOW_MS + 5_000), written_at("d-2", NOW_MS - 1_000)]
    result = q.emit([*batch, written_at("d-3", NOW_MS + 5_000)])
    assert sorted(o.header("delay-id") or b"" for o in p.producer.produced) == [b"d-1", b"d-3"]
    assert result.cancelled == 1
    # The clocks (read, then again once sealed for the batch's second), then the one marker a
    # control may apply to.
    table = p.settings.table_name
    read = [
        k["pk"]["S"] + "/" + k["sk"]["S"]
        for _, kw in proxy.calls
        for k in kw["RequestItems"][table]["Keys"]
    ]
    assert [k for k in read if k.startswith("cancel#")] == [
        f"cancel#{buckets.shard_of('d-2', p.settings.shards)}/d-2"
    ]
    assert len([k for k in read if k.startswith("clock#")]) <= 2 * 3


def requeued(p: Pipeline) -> list[tuple[int, DelayRequest]]:
    """Every delay message the emitter put back on the delay queue, with its DelaySeconds."""
    return [
        (e.delay_seconds, x.request)
        for e in p.delayed()
        for x in decode_body(e.body)
        if x.request is not None
    ]


def dead_letters(p: Pipeline) -> list[tuple[DelayRequest, dict[str, object]]]:
    """Every message the emitter dead-lettered, with its dead-letter record."""
    return [
        (x.request, dict(dead_letter_of(x.text) or {}))
        for e in p.dead_lettered()
        for x in decode_body(e.body)
        if x.request is not None
    ]


def test_a_refused_delivery_is_retried_alone_and_counts_an_attempt(p: Pipeline) -> None:
    p.producer = FakeProducer(fail_topics={"orders.lost"}, clock=p.clock)
    p.settings = p.settings.with_overrides(allowed_targets=("orders.*",))
    batch = [entry(p, NOW_MS, "ok"), entry(p, NOW_MS, "bad", target="orders.lost")]
    result = p.emit(batch)
    # Nothing is reported failed: the delivered message must not be delivered again.
    assert (result.failed, result.requeued) == ([], 1)
    assert [o.header("delay-id") for o in p.producer.produced] == [b"ok"]
    [(delay, again)] = requeued(p)
    assert (again.delay_id, again.attempts, delay) == ("bad", 1, 2)


def test_a_refused_delivery_backs_off_then_is_dead_lettered_with_its_reason(p: Pipeline) -> None:
    p.producer = FakeProducer(fail_topics={"orders.timeout"}, clock=p.clock)
    p.emit([entry(p, NOW_MS)])
    while not p.dead_lettered():
        p.deliver_released()
    assert p.settings.delivery_max_attempts == 5
    assert [delay for delay, _ in requeued(p)] == [2, 4, 8, 16]
    [(request, record)] = dead_letters(p)
    assert (request.delay_id, request.value, record["reason"]) == (
        "d-1",
        b"value",
        "target-refused",
    )
    assert "UNKNOWN_TOPIC_OR_PART" in str(record["detail"])
    assert p.producer.produced == []


def test_an_hour_long_outage_of_the_target_ends_with_everything_delivered(p: Pipeline) -> None:
    # The cluster cannot be reached for an hour: no attempt is used up, nothing is
    # dead-lettered, and everything is delivered once it is back.
    p.producer.unavailable = True
    p.emit([entry(p, NOW_MS + i * 100, f"d-{i}") for i in range(5)])
    while p.clock() < NOW_MS + 3_600_000:
        p.deliver_released()
    assert p.producer.produced == []
    p.producer.unavailable = False
    result = p.deliver_released()
    assert sorted(d.delay_id for d in result.deliveries) == [f"d-{i}" for i in range(5)]
    assert p.dead_lettered() == []
    assert all(r.attempts == 0 for _, r in requeued(p))
    # Retries back off to a minute: an hour costs under a hundred re-queues per message.
    assert len(requeued(p)) < 5 * 100


def test_an_outage_longer_than_the_limit_is_dead_lettered_with_its_reason(p: Pipeline) -> None:
    p.settings = p.settings.with_overrides(target_outage_max_seconds=300)
    p.producer.unavailable = True
    p.emit([entry(p, NOW_MS)])
    while not p.dead_lettered():
        p.deliver_released()
    [(_, record)] = dead_letters(p)
    assert record["reason"] == "target-unavailable"
    assert p.clock() - NOW_MS > 300_000


def test_when_nothing_can_be_sent_back_the_message_fails_with_a_short_back_off(
    p: Pipeline,
) -> None:
    # The re-queue itself keeps failing (out of retries): SQS brings the message back after
    # 2, 4, 8 ... s (by its receive count), not after the visibility timeout, and counts it
    # towards the DLQ. (A refusal is dead-lettered instead: test_emitter_bundles.)
    def send_message_batch(**_: object) -> object:
        raise client_error("ServiceUnavailable", status=503)

    p.producer.unavailable = True
    p.aws.sqs.send_message(QueueUrl=p.settings.delay_queue_url, MessageBody="x")
    [msg] = p.aws.sqs.receive_message(QueueUrl=p.settings.delay_queue_url)["Messages"]
    refusing = ClientProxy(p.sqs, send_message_batch=send_message_batch)
    p.delay_queue = DelayQueue(
        SqsQueue(as_sqs_client(refusing), p.settings.delay_queue_url, no_sleep_backoff()),
        p.settings.emit_lead_ms,
    )
    result = p.emit([entry(p, NOW_MS)], receive_count=3, receipt_handles=[msg["ReceiptHandle"]])
    assert len(result.failed) == 1
    assert p.sqs.visibility_changes == [(p.settings.delay_queue_url, msg["ReceiptHandle"], 8)]


def test_no_delivery_report_before_the_timeout_is_an_unreachable_target(p: Pipeline) -> None:
    p.producer = FakeProducer(silent=True, clock=p.clock)
    result = p.emit([entry(p, NOW_MS)])
    assert (result.failed, result.requeued) == ([], 1)
    assert "no delivery report" in result.errors[0]
    assert requeued(p)[0][1].attempts == 0


def test_a_produce_refusal_is_retried_as_a_refused_delivery(p: Pipeline) -> None:
    p.producer = FakeProducer(refuse=True, clock=p.clock)
    result = p.emit([entry(p, NOW_MS)])
    assert (result.failed, result.requeued) == ([], 1)
    assert "produce refused" in result.errors[0]
    assert requeued(p)[0][1].attempts == 1


def test_cancel_markers_that_cannot_be_read_retry_the_batch_after_a_back_off(
    p: Pipeline,
) -> None:
    # A cancel must win, so nothing is delivered; the messages come back in seconds, not
    # after the queue's visibility timeout.
    def batch_get_item(**_: object) -> object:
        raise EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    q = p.with_store_client(ClientProxy(p.aws.dynamodb, batch_get_item=batch_get_item))
    result = q.emit([entry(q, NOW_MS, "a"), entry(q, NOW_MS, "b")])
    assert q.producer.produced == []
    assert (result.failed, result.requeued) == ([], 2)
    assert [(delay, r.delay_id) for delay, r in requeued(q)] == [(2, "a"), (2, "b")]


def test_nothing_after_delivery_fails_the_batch(p: Pipeline) -> None:
    # The statistics write cannot reach DynamoDB: the delivered message stays delivered.
    def put_item(**_: object) -> object:
        raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    q = p.with_store_client(ClientProxy(p.aws.dynamodb, put_item=put_item))
    q.stats = DeliveryStats(policy=FlushPolicy(max_messages=1))
    result = q.emit([entry(q, NOW_MS)])
    assert (result.failed, len(result.deliveries)) == ([], 1)
    assert any("statistics not written" in e for e in result.errors)


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


def test_an_offloaded_value_is_restored_and_kept_for_every_copy(p: Pipeline) -> None:
    big = b"x" * (p.settings.offload_threshold_bytes + 1)
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="0", value=big)))
    [queued] = p.delayed()
    p.emit([queued])
    # An at-least-once duplicate of the same message finds its value too.
    p.emit([queued])
    assert [o.value for o in p.producer.produced] == [big, big]
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="payloads/")
    assert listed["KeyCount"] == 1


def offloaded(p: Pipeline, delay_id: str, key: str) -> SentEntry:
    """A pointer body for ``delay_id`` whose value is said to be at ``key``."""
    ref = f"s3://{p.settings.payload_bucket}/{key}"
    request = DelayRequest(delay_id, "reminders", NOW_MS, None, None, (), "t-0-1", ref)
    return SentEntry(p.settings.delay_queue_url, Envelope(request).encode(), 0, p.clock())


def own_key(delay_id: str) -> str:
    return payload_key(DelayRequest(delay_id, "reminders", NOW_MS, None, None, (), "t-0-1"))


def test_a_missing_offloaded_value_is_dead_lettered_at_once_and_the_rest_goes_on(
    p: Pipeline,
) -> None:
    result = p.emit([offloaded(p, "gone", own_key("gone")), entry(p, NOW_MS)])
    assert (result.failed, result.dead_lettered) == ([], 1)
    [(request, record)] = dead_letters(p)
    assert (request.delay_id, record["reason"]) == ("gone", "payload-missing")
    assert len(p.producer.produced) == 1


def test_a_payload_s3_cannot_serve_now_is_retried_not_dead_lettered(p: Pipeline) -> None:
    def get_object(**_: object) -> object:
        raise client_error("SlowDown", status=503)

    p.payloads = PayloadStore(
        as_s3_client(ClientProxy(p.aws.s3, get_object=get_object)),
        p.settings.payload_bucket,
        no_sleep_backoff(),
    )
    result = p.emit([offloaded(p, "slow", own_key("slow"))])
    assert (result.requeued, result.dead_lettered) == (1, 0)
    assert requeued(p)[0][1].attempts == 0


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


def test_offloaded_values_are_fetched_ahead_within_the_memory_budget(
    p: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 values of 300 KB, a budget of 1 MB: never more than the budget (plus the value
    # needed next) is fetched and not yet produced, whatever the batch holds.
    monkeypatch.setattr(constants, "EMIT_FETCH_BUDGET_BYTES", 1_000_000)
    size = 300_000
    produced_bytes: list[int] = []
    in_flight: list[int] = []

    class Counting(PayloadStore):
        submitted = 0

        def submit_restore(self, request: DelayRequest, deadline: Deadline) -> Any:
            Counting.submitted += request.offloaded_bytes
            in_flight.append(Counting.submitted - sum(produced_bytes))
            return super().submit_restore(request, deadline)

    class Recording(FakeProducer):
        def produce(
            self,
            topic: str,
            value: bytes | None = None,
            key: bytes | None = None,
            headers: Sequence[tuple[str, bytes | None]] | None = None,
            on_delivery: DeliveryCallback | None = None,
            **kwargs: Any,
        ) -> None:
            produced_bytes.append(len(value or b""))
            super().produce(topic, value, key, headers, on_delivery, **kwargs)

    p.payloads = Counting(p.aws.s3, p.settings.payload_bucket, no_sleep_backoff())
    p.producer = Recording(clock=p.clock)
    entries = []
    for i in range(20):
        request = DelayRequest(
            f"big-{i}", "reminders", NOW_MS, None, bytes([i]) * size, (), "t-0-1"
        )
        pointer = p.payloads.offload(request, p.deadline())
        entries.append(
            SentEntry(p.settings.delay_queue_url, Envelope(pointer).encode(), 0, p.clock())
        )
    result = p.emit(entries)
    assert (len(result.deliveries), result.failed) == (20, [])
    assert [o.value for o in p.producer.produced] == [bytes([i]) * size for i in range(20)]
    assert max(in_flight) <= 1_000_000 + size


def test_a_bundle_carries_at_most_its_budget_of_offloaded_bytes(p: Pipeline) -> None:
    # A pointer is small; the value it points at is not: bundles count the value.
    big = b"x" * (p.settings.offload_threshold_bytes + 1)
    records = [
        kafka_record(offset=i, target="reminders", seconds="30", value=big, id=f"b-{i}")
        for i in range(60)
    ]
    p.ingest(kafka_event(*records))
    per_bundle = [len(decode_body(e.body)) for e in p.delayed()]
    assert sum(per_bundle) == 60
    assert max(per_bundle) * len(big) <= constants.BUNDLE_MAX_OFFLOADED_BYTES
    assert len(per_bundle) > 1
