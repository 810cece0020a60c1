"""The direct path: ingest produces what is due within the direct window itself, never early,
and hands whatever it cannot deliver to the delay queue."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from delayq.envelope import decode_body
from delayq.exceptions import DelayQueueError
from delayq.ingest import IngestResult
from delayq.queues import DelayQueue, SqsQueue
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_event, kafka_record
from testkit.kafka import FakeProducer
from tests.factories import ClientProxy, client_error
from tests.functional.conftest import Pipeline


def ingest(
    p: Pipeline, *records: dict[str, Any], delay_queue: DelayQueue | None = None
) -> IngestResult:
    return p.ingest(kafka_event(*records), direct=True, delay_queue=delay_queue)


def produced_ids(p: Pipeline) -> list[str]:
    return [o.header("delay-id").decode() for o in p.producer.produced]  # type: ignore[union-attr]


def queued_ids(p: Pipeline) -> list[str]:
    return [x.request.delay_id for e in p.delayed() for x in decode_body(e.body) if x.request]


def test_a_message_due_now_is_produced_by_ingest_not_queued(p: Pipeline) -> None:
    result = ingest(p, kafka_record(target="reminders", ms="0", id="now"))
    assert produced_ids(p) == ["now"]
    assert p.delayed() == []
    [delivery] = result.deliveries
    assert (delivery.delay_id, delivery.lateness_ms, delivery.attempt) == ("now", 0, 1)
    [out] = p.producer.produced
    assert out.header("delay-attempt") == b"1"
    assert out.header("delay-due-ms") == str(NOW_MS).encode()


def test_a_message_due_within_the_window_is_held_to_its_due_never_earlier(p: Pipeline) -> None:
    ingest(
        p,
        kafka_record(offset=1, target="reminders", ms="750", id="later"),
        kafka_record(offset=2, target="reminders", ms="300", id="sooner"),
    )
    assert produced_ids(p) == ["sooner", "later"]
    assert p.producer.produced_at == [NOW_MS + 300, NOW_MS + 750]


def test_a_message_past_due_goes_at_once(p: Pipeline) -> None:
    ingest(p, kafka_record(timestamp=NOW_MS - 60_000, target="reminders", ms="1000", id="old"))
    assert p.producer.produced_at == [NOW_MS]


def test_beyond_the_window_messages_take_the_delay_queue(p: Pipeline) -> None:
    result = ingest(p, kafka_record(target="reminders", ms=str(p.settings.direct_window_ms + 1)))
    assert (result.deliveries, result.queued, p.producer.produced) == ([], 1, [])


def test_with_no_window_everything_takes_the_delay_queue(p: Pipeline) -> None:
    p.settings = p.settings.with_overrides(direct_window_ms=0)
    result = ingest(p, kafka_record(target="reminders", ms="0"))
    assert (result.deliveries, result.queued) == ([], 1)


def test_an_earlier_cancel_wins_over_the_direct_path(p: Pipeline) -> None:
    ingest(p, kafka_record(offset=1, timestamp=NOW_MS + 5, cancel="c-1"))
    result = ingest(p, kafka_record(offset=0, target="reminders", ms="0", id="c-1"))
    assert (result.direct_cancelled, p.producer.produced, p.delayed()) == (1, [], [])


def test_a_cancel_in_the_same_batch_wins_too(p: Pipeline) -> None:
    result = ingest(
        p,
        kafka_record(offset=1, target="reminders", ms="500", id="c-2"),
        kafka_record(offset=2, cancel="c-2"),
    )
    assert (result.direct_cancelled, p.producer.produced) == (1, [])


def test_a_failed_delivery_falls_back_to_the_delay_queue(p: Pipeline) -> None:
    p.producer = FakeProducer(fail_topics={"orders.lost"}, clock=p.clock)
    p.settings = p.settings.with_overrides(allowed_targets=("orders.*", "reminders"))
    result = ingest(
        p,
        kafka_record(offset=1, target="reminders", ms="0", id="ok"),
        kafka_record(offset=2, target="orders.lost", ms="0", id="lost"),
    )
    assert produced_ids(p) == ["ok"]
    assert queued_ids(p) == ["lost"]
    assert result.direct_fallback == 1
    assert any("lost" in e for e in result.errors)
    # The emitter takes it from there (with its own failure rules).
    p.producer = FakeProducer(clock=p.clock)
    assert p.deliver_released().deliveries[0].delay_id == "lost"


def test_cancel_markers_that_cannot_be_read_send_everything_to_the_queue(p: Pipeline) -> None:
    def batch_get_item(**_: Any) -> Any:
        raise EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    q = p.with_store_client(ClientProxy(p.aws.dynamodb, batch_get_item=batch_get_item))
    result = ingest(q, kafka_record(target="reminders", ms="0", id="unsure"))
    assert (q.producer.produced, queued_ids(q), result.direct_fallback) == ([], ["unsure"], 1)


def test_a_fallback_that_cannot_be_queued_fails_the_batch(p: Pipeline) -> None:
    # Kafka then redelivers the batch: nothing is lost (at worst a duplicate, same id).
    p.producer = FakeProducer(unavailable=True, clock=p.clock)

    def refuse(**_: Any) -> Any:
        raise client_error("AccessDenied", status=403)

    refusing = DelayQueue(
        SqsQueue(
            as_sqs_client(ClientProxy(p.aws.sqs, send_message_batch=refuse)),
            "q",
            no_sleep_backoff(),
        ),
        0,
    )
    with pytest.raises(DelayQueueError):
        ingest(p, kafka_record(target="reminders", ms="0"), delay_queue=refusing)


def test_a_large_value_goes_direct_whole_and_is_offloaded_only_when_it_falls_back(
    p: Pipeline,
) -> None:
    big = b"x" * (p.settings.offload_threshold_bytes + 1)
    ingest(p, kafka_record(target="reminders", ms="0", value=big, id="big"))
    assert [o.value for o in p.producer.produced] == [big]
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="payloads/")
    assert listed.get("KeyCount", 0) == 0

    p.producer = FakeProducer(unavailable=True, clock=p.clock)
    ingest(p, kafka_record(offset=1, target="reminders", ms="0", value=big, id="big-2"))
    [entry] = p.delayed()
    assert json.loads(entry.body)["payload_ref"] is not None


def test_direct_deliveries_are_counted_in_the_statistics(p: Pipeline) -> None:
    ingest(p, kafka_record(target="reminders", ms="0"))
    p.clock.advance(60_000)
    ingest(p, kafka_record(offset=1, target="reminders", ms="0"))
    items = p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
    assert any(i["pk"]["S"].startswith("stats#") for i in items)
