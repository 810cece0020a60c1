"""The sample events in events/ (shared by the tests and `sam local invoke -e`) have the shapes
AWS delivers, and each says what its name promises: which records are valid, cancels or bad,
and why, under the settings the tests use (DELAYQ_ALLOWED_TARGETS="orders.*,reminders")."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from delayq import buckets
from delayq import constants as c
from delayq.cleanup import is_ttl_removal
from delayq.emitter import messages_from_event
from delayq.envelope import Envelope
from delayq.records import (
    CancelRequest,
    DelayRequest,
    RejectedRecord,
    iter_event_records,
    parse_record,
)
from delayq.settings import Settings
from delayq.store import request_from_item
from delayq_local.filters import EventFilter
from testkit.clock import NOW_MS
from tests.factories import TARGETS, load_event

SETTINGS = Settings(allowed_targets=TARGETS)
EVENTS = (
    "msk_batch.json",
    "self_managed_kafka_batch.json",
    "schedule.json",
    "tick.json",
    "delay_queue_batch.json",
    "stream_ttl_batch.json",
)


def verdict(record: dict[str, Any]) -> str:
    """What ingest does with one record: queue, store, cancel, or the reject reason."""
    try:
        parsed = parse_record(record, SETTINGS, NOW_MS)
    except RejectedRecord as e:
        return str(e.reason)
    if isinstance(parsed, CancelRequest):
        return "cancel"
    assert isinstance(parsed, DelayRequest)
    return buckets.route(parsed.due_ms, NOW_MS, SETTINGS.horizon_seconds).value


def verdicts(event: dict[str, Any]) -> dict[int, str]:
    return {r["offset"]: verdict(r) for r in iter_event_records(event)}


@pytest.mark.parametrize("name", EVENTS)
def test_event_is_json(name: str) -> None:
    assert isinstance(load_event(name), dict)


@pytest.mark.parametrize("name", ["msk_batch.json", "self_managed_kafka_batch.json"])
def test_kafka_records_are_keyed_by_topic_partition_with_byte_array_headers(name: str) -> None:
    for key, records in load_event(name)["records"].items():
        for record in records:
            assert key == f"{record['topic']}-{record['partition']}"
            assert record["timestampType"] in {"CREATE_TIME", "LOG_APPEND_TIME"}
            for header in record["headers"]:
                ((_, value),) = header.items()
                assert all(isinstance(b, int) and 0 <= b <= 255 for b in value)


def test_msk_batch_mixes_valid_cancel_and_invalid_records() -> None:
    event = load_event("msk_batch.json")
    assert event["eventSource"] == "aws:kafka"
    assert event["eventSourceArn"].startswith("arn:aws:kafka:")
    assert verdicts(event) == {
        1001: "store",  # 30 minutes: beyond the horizon
        1002: "queue",  # delay-deliver-at 5 minutes ahead
        1003: "queue",  # delay-ms, default id
        1004: "cancel",
        1005: "missing-target",
        88: "bad-base64",
        89: "target-not-allowed",
        90: "delay-too-long",
    }


def test_self_managed_batch_has_no_event_source_arn() -> None:
    event = load_event("self_managed_kafka_batch.json")
    assert event["eventSource"] == "SelfManagedKafka"
    assert "eventSourceArn" not in event
    assert verdicts(event) == {52011: "store", 52012: "queue", 52013: "cancel"}


def test_schedule_is_an_eventbridge_scheduled_event() -> None:
    event = load_event("schedule.json")
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == "aws.events"
    assert event["resources"][0].startswith("arn:aws:events:")


def test_tick_is_a_fifo_message_deduplicated_by_its_index() -> None:
    (record,) = load_event("tick.json")["Records"]
    body = json.loads(record["body"])
    assert set(body) == {"tick", "tick_seconds", "at_ms"}
    assert body["tick"] == buckets.tick_index(body["at_ms"], body["tick_seconds"])
    attributes = record["attributes"]
    assert attributes["MessageGroupId"] == c.TICK_GROUP_ID
    assert attributes["MessageDeduplicationId"] == buckets.tick_dedup_id(body["tick"])
    assert record["eventSourceARN"].endswith(".fifo")
    assert record["md5OfBody"] == hashlib.md5(record["body"].encode()).hexdigest()  # noqa: S324 -- SQS's checksum


def test_delay_queue_batch_carries_envelopes_as_sqs_delivers_them() -> None:
    event = load_event("delay_queue_batch.json")
    messages = messages_from_event(event)
    requests = [Envelope.decode(m.body).request for m in messages]
    assert [r.delay_id for r in requests] == [
        "reminder-42-trip",
        "delay-requests-0-1003",
        "order-7731-timeout",
        "order-7740-timeout",
    ]
    for record in event["Records"]:
        assert record["md5OfBody"] == hashlib.md5(record["body"].encode()).hexdigest()  # noqa: S324 -- SQS's checksum
        assert {"ApproximateReceiveCount", "SentTimestamp"} <= set(record["attributes"])
        assert record["messageAttributes"] == {}
    # a retried message, an offloaded value, one due too far ahead to hold
    assert max(m.receive_count for m in messages) > 1
    assert [r.delay_id for r in requests if r.payload_ref] == ["order-7731-timeout"]
    early = [r for r in requests if r.due_ms - NOW_MS > c.DEFAULT_MAX_HOLD_MS]
    assert [r.delay_id for r in early] == ["order-7740-timeout"]


def test_stream_batch_has_one_ttl_removal_and_one_user_removal() -> None:
    records = load_event("stream_ttl_batch.json")["Records"]
    assert [r["eventName"] for r in records] == ["REMOVE", "REMOVE"]
    assert [is_ttl_removal(r) for r in records] == [True, False]
    for record in records:
        image = record["dynamodb"]["OldImage"]
        assert image["kind"] == {"S": c.KIND_MESSAGE}
        request = request_from_item(image)
        second, _ = buckets.parse_bucket_key(image["pk"]["S"])
        assert second == buckets.due_second(request.due_ms)
    expired = records[0]["dynamodb"]["OldImage"]
    assert int(expired[c.ATTR_TTL]["N"]) < NOW_MS // 1000


def test_template_stream_filter_passes_only_the_ttl_removal(resources: dict[str, Any]) -> None:
    (event,) = resources["CleanupFunction"]["Properties"]["Events"].values()
    stream_filter = EventFilter.from_criteria(event["Properties"]["FilterCriteria"])
    assert stream_filter is not None
    records = load_event("stream_ttl_batch.json")["Records"]
    assert [stream_filter.matches(r) for r in records] == [True, False]
