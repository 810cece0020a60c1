"""Ingest: routing, cancels, rejects, claim-check; valid records are never dropped."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from delayq import buckets
from delayq.exceptions import MalformedEventError, RetriesExhaustedError
from delayq.ordering import Marker
from delayq.store import MessageStore, Watermark, id_of_sort_key
from testkit.aws import as_dynamodb_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_event, kafka_record
from tests.functional.conftest import Pipeline


def stored_items(p: Pipeline) -> list[dict[str, Any]]:
    """The stored messages (not the watermark and markers beside them), as DynamoDB JSON."""
    items = p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
    return [i for i in items if i.get("kind", {}).get("S") == "msg"]


def test_short_delay_goes_to_the_delay_queue_with_whole_seconds_rounded_down(p: Pipeline) -> None:
    p.ingest(kafka_event(kafka_record(target="orders.timeout", ms="30500")))
    [entry] = p.delayed()
    # 30.5 s minus the 1 s lead, rounded down: released at or before due.
    assert entry.delay_seconds == 29
    assert entry.release_ms <= NOW_MS + 30_500


def test_long_delay_is_stored_in_its_due_second_bucket_with_ttl(p: Pipeline) -> None:
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="3600", id="r-1")))
    [item] = stored_items(p)
    second = (NOW_MS + 3_600_000) // 1000
    assert item["pk"]["S"] == buckets.bucket_key(second, buckets.shard_of("r-1", p.settings.shards))
    assert id_of_sort_key(item) == "r-1"  # then the record's version tag
    assert int(item["expires_at"]["N"]) == second + p.settings.ttl_grace_seconds
    assert p.delayed() == []


def test_due_exactly_at_the_horizon_is_queued_and_one_ms_later_is_stored(p: Pipeline) -> None:
    horizon_ms = p.settings.horizon_seconds * 1000
    p.ingest(
        kafka_event(
            kafka_record(offset=1, target="reminders", ms=str(horizon_ms)),
            kafka_record(offset=2, target="reminders", ms=str(horizon_ms + 1)),
        )
    )
    assert [json.loads(e.body)["src"] for e in p.delayed()] == ["delay-requests-0-1"]
    assert [i["sk"]["S"] for i in stored_items(p)] == ["delay-requests-0-2"]


def test_bad_records_are_rejected_with_reason_and_original_while_good_ones_go_on(
    p: Pipeline,
) -> None:
    bad_b64 = kafka_record(offset=2, target="reminders", seconds="5")
    bad_b64["value"] = "***not base64***"
    event = kafka_event(
        kafka_record(offset=1, target="reminders", seconds="5"),
        bad_b64,
        kafka_record(offset=3, seconds="5"),
        kafka_record(offset=4, target="payments.capture", seconds="5"),
        kafka_record(offset=5, target="reminders", seconds=str(8 * 24 * 3600)),
        kafka_record(offset=6, target="reminders", seconds="7200"),
    )
    result = p.ingest(event)
    assert result.queued == 1
    assert result.stored == 1
    rejects = p.aws.bodies(p.settings.reject_queue_url)
    by_offset = {r["source"]["offset"]: r for r in rejects}
    assert {o: r["reason"] for o, r in by_offset.items()} == {
        2: "bad-base64",
        3: "missing-target",
        4: "target-not-allowed",
        5: "delay-too-long",
    }
    assert by_offset[2]["record"] == bad_b64
    assert by_offset[4]["source"] == {"topic": "delay-requests", "partition": 0, "offset": 4}


def test_a_cancel_record_writes_a_marker_with_its_record_time(p: Pipeline) -> None:
    result = p.ingest(kafka_event(kafka_record(offset=3, timestamp=NOW_MS - 5, cancel="order-42")))
    assert result.cancelled == 1
    assert p.store.markers(["order-42", "order-43"], p.deadline()) == {
        "order-42": Marker(cancel=(NOW_MS - 5, "delay-requests-0-3"))
    }


def test_a_cancel_and_a_later_message_with_its_id_in_one_batch_keep_the_message(
    p: Pipeline,
) -> None:
    # Reschedule by id: send r-1, cancel r-1, send r-1 again; the last one is a new message.
    event = kafka_event(
        kafka_record(offset=1, target="reminders", seconds="60", id="r-1"),
        kafka_record(offset=2, cancel="r-1"),
        kafka_record(offset=3, target="reminders", seconds="5", id="r-1"),
    )
    p.ingest(event)
    result = p.deliver_released()
    assert result.cancelled == 1
    assert [d.delay_id for d in result.deliveries] == ["r-1"]
    assert [d.due_ms for d in result.deliveries] == [NOW_MS + 5000]


def test_a_record_the_parser_fails_on_is_rejected_whole_and_the_rest_goes_on(
    p: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One record must never block its partition: a bug in the parser becomes a reject with
    # the original record, not a failed batch retried until the topic's retention.
    from delayq import ingest, records

    real = records.parse_record  # the function ingest imported

    def parse(record: dict[str, object], *args: object) -> object:
        if record["offset"] == 2:
            raise KeyError("a case the parser did not foresee")
        return real(record, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ingest, "parse_record", parse)
    broken = kafka_record(offset=2, target="reminders", seconds="5")
    result = p.ingest(kafka_event(kafka_record(offset=1, target="reminders", seconds="5"), broken))
    assert result.queued == 1
    [reject] = p.aws.bodies(p.settings.reject_queue_url)
    assert reject["reason"] == "internal-error"
    assert "KeyError" in reject["detail"]
    assert reject["record"] == broken


def test_large_values_are_offloaded_to_s3_and_the_queue_carries_a_pointer(p: Pipeline) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="10", value=big, id="big")))
    [entry] = p.delayed()
    body = json.loads(entry.body)
    assert body["value"] is None
    bucket, _, key = body["payload_ref"][5:].partition("/")
    assert p.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read() == big


def test_stored_below_a_watermark_that_moved_is_also_queued(p: Pipeline) -> None:
    due_second = (NOW_MS + 3_600_000) // 1000
    p.store.create_watermark(due_second + 5, NOW_MS, p.deadline())
    result = p.ingest(kafka_event(kafka_record(target="reminders", seconds="3600")))
    assert result.stored == 1
    assert result.rescued == 1
    assert len(p.delayed()) == 1


def test_stored_in_the_second_the_scheduler_is_working_through_is_also_queued(
    p: Pipeline,
) -> None:
    due_second = (NOW_MS + 3_600_000) // 1000
    pk = buckets.bucket_key(due_second, 0)
    p.store.write_watermark(None, Watermark(due_second - 1, {pk: "zzz"}), NOW_MS, p.deadline())
    result = p.ingest(kafka_event(kafka_record(target="reminders", seconds="3600")))
    assert (result.stored, result.rescued) == (1, 1)
    assert len(p.delayed()) == 1


def test_stored_just_after_a_watermark_with_no_progress_inside_is_left_to_the_scheduler(
    p: Pipeline,
) -> None:
    due_second = (NOW_MS + 3_600_000) // 1000
    p.store.create_watermark(due_second - 1, NOW_MS, p.deadline())
    result = p.ingest(kafka_event(kafka_record(target="reminders", seconds="3600")))
    assert (result.stored, result.rescued) == (1, 0)
    assert p.delayed() == []


def test_stored_within_the_window_a_run_announced_is_also_queued(p: Pipeline) -> None:
    # A run recorded its window and may have read this second before our write landed:
    # whatever the clocks, ingest queues the message itself.
    due_second = (NOW_MS + 3_600_000) // 1000
    start = p.store.create_watermark(due_second - 100, NOW_MS, p.deadline())
    p.store.write_watermark(
        start, Watermark(due_second - 100, reading=due_second), NOW_MS, p.deadline()
    )
    result = p.ingest(kafka_event(kafka_record(target="reminders", seconds="3600")))
    assert (result.stored, result.rescued) == (1, 1)
    assert len(p.delayed()) == 1


def test_the_first_store_creates_the_watermark_below_every_stored_second(p: Pipeline) -> None:
    # The scheduler's first run must start at or before the earliest stored due-second.
    assert p.store.read_watermark(p.deadline()) is None
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="3600")))
    mark = p.store.read_watermark(p.deadline())
    assert mark is not None
    assert mark.second == NOW_MS // 1000 - 1
    assert p.delayed() == []


def test_a_queued_only_batch_creates_no_watermark(p: Pipeline) -> None:
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="5")))
    assert p.store.read_watermark(p.deadline()) is None


def test_a_record_that_cannot_be_stored_fails_the_invocation(p: Pipeline) -> None:
    class AlwaysUnprocessed:
        def __init__(self, inner: object) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

        def batch_write_item(self, RequestItems: dict[str, list[object]]) -> dict[str, object]:  # noqa: N803
            return {"UnprocessedItems": RequestItems}

    p.store = MessageStore(
        as_dynamodb_client(AlwaysUnprocessed(p.aws.dynamodb)),
        p.settings.table_name,
        shards=p.settings.shards,
        ttl_grace_seconds=p.settings.ttl_grace_seconds,
        max_delay_seconds=p.settings.max_delay_seconds,
        backoff=no_sleep_backoff(),
    )
    with pytest.raises(RetriesExhaustedError) as raised:
        p.ingest(kafka_event(kafka_record(target="reminders", seconds="7200")))
    assert len(raised.value.unsent) == 1
    # Nothing was rejected: the record stays on Kafka for redelivery, not in a dead end.
    assert p.aws.bodies(p.settings.reject_queue_url) == []


def test_redelivery_of_the_same_batch_stores_one_item(p: Pipeline) -> None:
    event = kafka_event(kafka_record(target="reminders", seconds="7200"))
    p.ingest(event)
    p.ingest(event)
    assert len(stored_items(p)) == 1


def test_an_event_that_is_not_a_kafka_event_fails_loudly(p: Pipeline) -> None:
    with pytest.raises(MalformedEventError):
        p.ingest({"Records": []})


def test_key_value_and_user_headers_are_kept_byte_for_byte(p: Pipeline) -> None:
    record = kafka_record(
        target="reminders",
        seconds="1",
        key=b"\x00\xffkey",
        value=b"\x01\x02",
        headers=[{"trace": [0, 255, 1]}, {"trace": [2]}],
    )
    p.ingest(kafka_event(record))
    body = json.loads(p.delayed()[0].body)
    assert base64.b64decode(body["key"]) == b"\x00\xffkey"
    assert body["headers"] == [["trace", "AP8B"], ["trace", "Ag=="]]
