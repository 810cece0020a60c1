"""The emitter with bundles: each message of a bundle screened, cancel-checked, held to its own
due and checked on its own delivery report; what failed inside a bundle goes back to the delay
queue alone, so nothing is lost, nothing is early, and nothing delivered is delivered again."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest

from delayq.emitter import EmitResult, emit_batch, messages_from_event
from delayq.envelope import Envelope, decode_body, encode_bundle
from delayq.payloads import PayloadStore, payload_key
from delayq.queues import DelayQueue, SqsQueue
from delayq.records import DelayRequest
from delayq.retry import Deadline
from testkit.aws import as_s3_client, as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_event, kafka_record
from testkit.kafka import FakeProducer
from tests.factories import ClientProxy, SentEntry, client_error, sqs_event
from tests.functional.conftest import Pipeline


@pytest.fixture
def orders_only(pipeline: Pipeline) -> Pipeline:
    """The pipeline with only ``orders.*`` allowed as targets."""
    pipeline.settings = pipeline.settings.with_overrides(allowed_targets=("orders.*",))
    return pipeline


def request(delay_id: str, due_ms: int = NOW_MS, target: str = "orders.timeout") -> DelayRequest:
    return DelayRequest(delay_id, target, due_ms, b"k", delay_id.encode(), (("h", b"1"),), "t-0-1")


def bundle(p: Pipeline, *entries: DelayRequest | str) -> SentEntry:
    texts = [e if isinstance(e, str) else Envelope(e).encode() for e in entries]
    return SentEntry(p.settings.delay_queue_url, encode_bundle(texts), 0, p.clock())


def emit(
    p: Pipeline,
    entries: list[SentEntry],
    *,
    delay_queue: SqsQueue | None = None,
    deadline: Deadline | None = None,
    receipt_handles: list[str] | None = None,
) -> EmitResult:
    services = p.emitter_services(
        delay_queue=None
        if delay_queue is None
        else DelayQueue(delay_queue, p.settings.emit_lead_ms)
    )
    event = sqs_event(entries)
    for record, handle in zip(event["Records"], receipt_handles or [], strict=False):
        record["receiptHandle"] = handle
    return emit_batch(
        messages_from_event(event),
        settings=p.settings,
        services=services,
        clock=p.clock,
        sleep=p.clock.sleep,
        deadline=deadline or p.deadline(),
    )


def produced_ids(p: Pipeline) -> list[str]:
    return [o.header("delay-id").decode() for o in p.producer.produced]  # type: ignore[union-attr]


def requeued_ids(p: Pipeline) -> list[list[str]]:
    return [[e.request.delay_id for e in decode_body(x.body) if e.request] for x in p.delayed()]


def test_every_message_of_a_bundle_is_delivered_with_its_own_bytes(orders_only: Pipeline) -> None:
    result = emit(orders_only, [bundle(orders_only, *(request(f"b-{i}") for i in range(5)))])
    assert (result.failed, len(result.deliveries)) == ([], 5)
    assert produced_ids(orders_only) == [f"b-{i}" for i in range(5)]
    assert [o.value for o in orders_only.producer.produced] == [f"b-{i}".encode() for i in range(5)]


def test_bad_cancelled_and_forged_entries_are_handled_alone_and_the_rest_goes_on(
    orders_only: Pipeline,
) -> None:
    orders_only.ingest(kafka_event(kafka_record(cancel="cancelled")))
    theirs = payload_key(request("theirs"))
    forged = DelayRequest(
        "forged",
        "orders.timeout",
        NOW_MS,
        None,
        None,
        (),
        "t-0-1",
        f"s3://{orders_only.settings.payload_bucket}/{theirs}",
    )
    not_ours = '{"v":1,"id":"x"}'
    body = bundle(
        orders_only,
        request("ok-1"),
        not_ours,
        request("off", target="payments.capture"),
        request("cancelled"),
        forged,
        request("ok-2"),
    )

    result = emit(orders_only, [body])

    assert (result.failed, result.rejected, result.cancelled) == ([], 3, 1)
    assert produced_ids(orders_only) == ["ok-1", "ok-2"]
    rejects = orders_only.aws.bodies(orders_only.settings.reject_queue_url)
    assert Counter(r["reason"] for r in rejects) == {"bad-envelope": 2, "target-not-allowed": 1}
    bodies = {r["record"]["body"] for r in rejects}
    # Each reject keeps its entry as a body of its own, as it came.
    assert bodies == {
        not_ours,
        Envelope(request("off", target="payments.capture")).encode(),
        Envelope(forged).encode(),
    }
    assert orders_only.delayed() == []


def test_each_message_is_held_to_its_own_due_never_earlier(orders_only: Pipeline) -> None:
    dues = [NOW_MS + 900, NOW_MS + 100, NOW_MS + 2_500, NOW_MS - 40]
    result = emit(
        orders_only, [bundle(orders_only, *(request(f"d-{i}", d) for i, d in enumerate(dues)))]
    )
    assert orders_only.producer.produced_at == sorted(max(d, NOW_MS) for d in dues)
    assert [d.lateness_ms for d in result.deliveries] == [40, 0, 0, 0]


def test_a_bundle_too_early_to_hold_is_hidden_again_whole_and_rejects_nothing_yet(
    orders_only: Pipeline,
) -> None:
    orders_only.aws.sqs.send_message(QueueUrl=orders_only.settings.delay_queue_url, MessageBody="x")
    [msg] = orders_only.aws.sqs.receive_message(QueueUrl=orders_only.settings.delay_queue_url)[
        "Messages"
    ]
    early = bundle(
        orders_only, request("e-1", NOW_MS + 60_000), "{}", request("e-2", NOW_MS + 61_000)
    )

    result = emit(orders_only, [early], receipt_handles=[msg["ReceiptHandle"]])

    assert (len(result.failed), result.redelayed, result.rejected) == (1, 3, 0)
    assert (orders_only.producer.produced, orders_only.clock.slept) == ([], [])
    assert orders_only.aws.bodies(orders_only.settings.reject_queue_url) == []


def test_a_message_too_early_in_a_due_bundle_goes_back_alone(orders_only: Pipeline) -> None:
    result = emit(
        orders_only, [bundle(orders_only, request("now"), request("later", NOW_MS + 30_000))]
    )
    assert (result.failed, result.requeued, produced_ids(orders_only)) == ([], 1, ["now"])
    [back] = orders_only.delayed()
    assert (requeued_ids(orders_only), back.delay_seconds) == ([["later"]], 28)


def test_a_partial_kafka_failure_sends_back_only_the_failed_messages(orders_only: Pipeline) -> None:
    orders_only.producer = FakeProducer(fail_topics={"orders.lost"}, clock=orders_only.clock)
    batch = [
        bundle(
            orders_only,
            request("ok-1"),
            request("lost-1", target="orders.lost"),
            request("ok-2"),
            request("lost-2", target="orders.lost"),
        )
    ]

    result = emit(orders_only, batch)

    assert (result.failed, result.requeued, len(result.deliveries)) == ([], 2, 2)
    assert sum("target-refused" in e for e in result.errors) == 2
    assert requeued_ids(orders_only) == [["lost-1", "lost-2"]]
    assert orders_only.delayed()[0].delay_seconds == 2  # the first refusal's back-off

    # Kafka takes them now: the re-queued bundle delivers the rest, and nothing twice.
    orders_only.producer = FakeProducer(clock=orders_only.clock)
    assert emit(orders_only, orders_only.delayed()).failed == []
    assert sorted(produced_ids(orders_only)) == ["lost-1", "lost-2"]


def test_a_bundle_whose_every_message_failed_goes_back_as_a_new_message(
    orders_only: Pipeline,
) -> None:
    # Its attempts travel in the envelopes (not in SQS's receive count, which a re-queue
    # resets): a refused message is dead-lettered at its own limit whatever happened to it.
    orders_only.producer = FakeProducer(fail_topics={"orders.lost"}, clock=orders_only.clock)
    batch = [
        bundle(orders_only, request("a", target="orders.lost"), request("b", target="orders.lost"))
    ]
    result = emit(orders_only, batch)
    assert (result.failed, result.requeued) == ([], 2)
    assert [
        [e.request.attempts for e in decode_body(x.body) if e.request]
        for x in orders_only.delayed()
    ] == [[1, 1]]


def test_a_payload_that_cannot_be_read_goes_back_alone_as_it_came(orders_only: Pipeline) -> None:
    def get_object(**_: Any) -> Any:
        raise client_error("InternalError", status=500)

    orders_only.payloads = PayloadStore(
        as_s3_client(ClientProxy(orders_only.aws.s3, get_object=get_object)),
        orders_only.settings.payload_bucket,
        no_sleep_backoff(),
    )
    ref = f"s3://{orders_only.settings.payload_bucket}/{payload_key(request('gone'))}"
    gone = DelayRequest("gone", "orders.timeout", NOW_MS, None, None, (), "t-0-1", ref)
    result = emit(orders_only, [bundle(orders_only, request("ok"), gone)])
    assert (result.failed, result.requeued, produced_ids(orders_only)) == ([], 1, ["ok"])
    # It goes back as it came: a pointer, not a value; only the time of its first failed
    # delivery is added (the outage allowance counts from it).
    [[entry]] = [decode_body(x.body) for x in orders_only.delayed()]
    assert entry.text == Envelope(dataclasses.replace(gone, failing_since_ms=NOW_MS)).encode()


def test_when_sending_back_keeps_failing_the_original_is_reported_failed(
    orders_only: Pipeline,
) -> None:
    orders_only.producer = FakeProducer(fail_topics={"orders.lost"}, clock=orders_only.clock)

    def refuse(**_: Any) -> Any:
        raise client_error("ServiceUnavailable", status=503, operation="SendMessageBatch")

    refusing = SqsQueue(
        as_sqs_client(ClientProxy(orders_only.aws.sqs, send_message_batch=refuse)),
        orders_only.settings.delay_queue_url,
        no_sleep_backoff(),
    )
    batch = [bundle(orders_only, request("ok"), request("lost", target="orders.lost"))]
    result = emit(orders_only, batch, delay_queue=refusing)
    # Reported failed: SQS delivers the bundle again, and "ok" a second time (same delay-id).
    # The back-off follows the receive count (2 s at the first receive).
    assert (len(result.failed), result.requeued, produced_ids(orders_only)) == (1, 0, ["ok"])
    assert any("not sent back" in e for e in result.errors)


def test_a_message_the_delay_queue_refuses_back_is_dead_lettered_alone(
    orders_only: Pipeline,
) -> None:
    # Kafka refuses "lost" and the delay queue refuses to take it back (AccessDenied): it is
    # settled alone, so its bundle-mates, already produced, are not produced again however
    # often SQS would bring the bundle back.
    orders_only.producer = FakeProducer(fail_topics={"orders.lost"}, clock=orders_only.clock)

    def refuse(**_: Any) -> Any:
        raise client_error("AccessDenied", status=403, operation="SendMessageBatch")

    refusing = SqsQueue(
        as_sqs_client(ClientProxy(orders_only.aws.sqs, send_message_batch=refuse)),
        orders_only.settings.delay_queue_url,
        no_sleep_backoff(),
    )
    lost = request("lost", target="orders.lost")
    batch = [bundle(orders_only, request("ok-1"), lost, request("ok-2"))]
    for receive in range(1, 11):  # SQS's maxReceiveCount: at most 10 receives
        event = sqs_event(batch, receive)
        result = emit_batch(
            messages_from_event(event),
            settings=orders_only.settings,
            services=orders_only.emitter_services(
                delay_queue=DelayQueue(refusing, orders_only.settings.emit_lead_ms)
            ),
            clock=orders_only.clock,
            sleep=orders_only.clock.sleep,
            deadline=orders_only.deadline(),
        )
        if not result.failed:
            break
        orders_only.clock.advance(2**receive * 1000)

    assert result.failed == []
    assert Counter(produced_ids(orders_only)) == Counter({"ok-1": 1, "ok-2": 1})
    [[entry]] = [decode_body(x.body) for x in orders_only.dead_lettered()]
    assert entry.request is not None
    assert (entry.request.delay_id, entry.request.attempts) == ("lost", 1)
    dead = json.loads(entry.text)["dead_letter"]
    assert dead["reason"] == "target-refused"
    assert "AccessDenied" in dead["detail"]
    # The original bytes are all there: the envelope, plus its attempts and why.
    assert entry.request.value == lost.value


def test_what_the_deadline_leaves_unproduced_goes_back_to_the_queue(orders_only: Pipeline) -> None:
    # 13 s left: the flush (10 s) and 2 s of reserve leave 1 s to hold and produce.
    end_ms = NOW_MS + 13_000
    deadline = Deadline(lambda: end_ms - orders_only.clock(), safety_ms=0)
    dues = [NOW_MS, NOW_MS + 500, NOW_MS + 2_000, NOW_MS + 2_500]
    result = emit(
        orders_only,
        [bundle(orders_only, *(request(f"d-{i}", d) for i, d in enumerate(dues)))],
        deadline=deadline,
    )
    assert (result.failed, produced_ids(orders_only), result.requeued) == ([], ["d-0", "d-1"], 2)
    assert requeued_ids(orders_only) == [["d-2", "d-3"]]
    assert all(at >= due for at, due in zip(orders_only.producer.produced_at, dues, strict=False))


def test_a_reject_queue_failure_sends_the_rejected_entry_back_with_the_bundle_done(
    orders_only: Pipeline,
) -> None:
    def refuse(**_: Any) -> Any:
        raise client_error("AccessDenied", status=403, operation="SendMessageBatch")

    orders_only.rejects.queue = SqsQueue(
        as_sqs_client(ClientProxy(orders_only.aws.sqs, send_message_batch=refuse)),
        orders_only.settings.reject_queue_url,
        no_sleep_backoff(),
    )
    result = emit(
        orders_only, [bundle(orders_only, request("ok"), request("off", target="payments.capture"))]
    )
    assert (result.failed, result.rejected, result.requeued, produced_ids(orders_only)) == (
        [],
        0,
        1,
        ["ok"],
    )
    [[entry]] = [decode_body(x.body) for x in orders_only.delayed()]
    assert json.loads(entry.text)["id"] == "off"


def test_version_1_and_bundles_mix_in_one_batch(orders_only: Pipeline) -> None:
    single = SentEntry(
        orders_only.settings.delay_queue_url,
        Envelope(request("single")).encode(),
        0,
        orders_only.clock(),
    )
    result = emit(orders_only, [single, bundle(orders_only, request("b-1"), request("b-2"))])
    assert (result.failed, sorted(produced_ids(orders_only))) == ([], ["b-1", "b-2", "single"])
