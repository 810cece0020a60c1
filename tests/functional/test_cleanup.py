"""Cleanup: TTL removals of never-scheduled messages are re-driven; others only cleaned."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from delayq import buckets
from delayq.cleanup import CleanupServices, Outcome, TtlCleanup, is_ttl_removal
from delayq.contract import DelayRequest
from delayq.payloads import payload_key
from delayq.store import message_item
from tests.factories import NOW_MS
from tests.functional.conftest import Pipeline

TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


def stream_image(item: dict[str, Any]) -> dict[str, Any]:
    """A low-level item as a stream record shows it (binary as base64 text)."""
    return {k: {"B": base64.b64encode(v["B"]).decode()} if "B" in v else v for k, v in item.items()}


def removed_request(due_ms: int, ref: str | None = None) -> DelayRequest:
    return DelayRequest("r-1", "reminders", due_ms, b"k", b"v", (("h", b"1"),), "t-0-9", ref)


def removal(
    p: Pipeline, due_ms: int, *, ttl: bool = True, ref: str | None = None
) -> dict[str, Any]:
    request = removed_request(due_ms, ref)
    image = stream_image(message_item(request, p.settings.shards, 86400))
    record: dict[str, Any] = {
        "eventID": "1",
        "eventName": "REMOVE",
        "eventSource": "aws:dynamodb",
        "dynamodb": {"Keys": {"pk": image["pk"], "sk": image["sk"]}, "OldImage": image},
    }
    if ttl:
        record["userIdentity"] = TTL_IDENTITY
    return record


def cleanup(p: Pipeline) -> TtlCleanup:
    services = CleanupServices(p.store, p.delay_queue, p.payloads)
    return TtlCleanup(services, clock=p.clock, deadline=p.deadline())


def test_a_message_the_scheduler_never_reached_is_redriven_unchanged(p: Pipeline) -> None:
    due = NOW_MS - 86_400_000
    p.store.advance_watermark(None, buckets.due_second(due) - 10, NOW_MS, p.deadline())
    assert cleanup(p).handle(removal(p, due)) is Outcome.REDRIVEN
    [entry] = p.delayed()
    body = json.loads(entry.body)
    assert (body["id"], body["due_ms"], body["value"]) == ("r-1", due, "dg==")
    assert entry.delay_seconds == 0


def test_with_no_watermark_at_all_the_message_is_redriven(p: Pipeline) -> None:
    assert cleanup(p).handle(removal(p, NOW_MS - 86_400_000)) is Outcome.REDRIVEN


def test_a_scheduled_message_is_not_redriven_and_its_payload_is_deleted(p: Pipeline) -> None:
    due = NOW_MS - 86_400_000
    key = payload_key(removed_request(due))
    p.aws.s3.put_object(Bucket=p.settings.payload_bucket, Key=key, Body=b"big")
    p.store.advance_watermark(None, buckets.due_second(NOW_MS), NOW_MS, p.deadline())
    ref = f"s3://{p.settings.payload_bucket}/{key}"
    assert cleanup(p).handle(removal(p, due, ref=ref)) is Outcome.CLEANED
    assert p.delayed() == []
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="payloads/")
    assert listed.get("KeyCount", 0) == 0


def test_a_stored_pointer_to_another_object_deletes_nothing(p: Pipeline) -> None:
    due = NOW_MS - 86_400_000
    other = payload_key(replace(removed_request(due), delay_id="someone-else"))
    p.aws.s3.put_object(Bucket=p.settings.payload_bucket, Key=other, Body=b"theirs")
    p.store.advance_watermark(None, buckets.due_second(NOW_MS), NOW_MS, p.deadline())
    ref = f"s3://{p.settings.payload_bucket}/{other}"
    assert cleanup(p).handle(removal(p, due, ref=ref)) is Outcome.CLEANED
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="payloads/")
    assert [o["Key"] for o in listed["Contents"]] == [other]


def test_a_user_delete_is_ignored(p: Pipeline) -> None:
    assert cleanup(p).handle(removal(p, NOW_MS, ttl=False)) is Outcome.IGNORED
    assert p.delayed() == []


def test_removals_of_other_item_kinds_are_ignored(p: Pipeline) -> None:
    record = {
        "eventName": "REMOVE",
        "userIdentity": TTL_IDENTITY,
        "dynamodb": {
            "OldImage": {"pk": {"S": "cancel#1"}, "sk": {"S": "x"}, "kind": {"S": "cancel"}}
        },
    }
    assert cleanup(p).handle(record) is Outcome.IGNORED


def test_ttl_removal_is_recognised_only_from_the_service_principal() -> None:
    assert is_ttl_removal({"eventName": "REMOVE", "userIdentity": TTL_IDENTITY})
    assert not is_ttl_removal({"eventName": "MODIFY", "userIdentity": TTL_IDENTITY})
    assert not is_ttl_removal(
        {"eventName": "REMOVE", "userIdentity": {"type": "Service", "principalId": "someone"}}
    )


@pytest.fixture
def p(pipeline: Pipeline) -> Pipeline:
    return pipeline
