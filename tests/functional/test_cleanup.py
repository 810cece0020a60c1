"""Cleanup: TTL removals that may never have been scheduled are re-driven; nothing deleted."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from delayq import buckets
from delayq.cleanup import CleanupServices, Outcome, TtlCleanup, is_ttl_removal
from delayq.exceptions import DelayQueueError
from delayq.payloads import payload_key
from delayq.queues import DelayQueue, SqsQueue
from delayq.records import DelayRequest
from delayq.store import Watermark, message_item
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS
from tests.factories import ClientProxy, client_error
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
    services = CleanupServices(p.store, p.delay_queue)
    return TtlCleanup(services, clock=p.clock, deadline=p.deadline())


def test_a_message_the_scheduler_never_reached_is_redriven_unchanged(p: Pipeline) -> None:
    due = NOW_MS - 86_400_000
    p.store.create_watermark(buckets.due_second(due) - 10, NOW_MS, p.deadline())
    assert cleanup(p).handle(removal(p, due)) is Outcome.REDRIVEN
    [entry] = p.delayed()
    body = json.loads(entry.body)
    assert (body["id"], body["due_ms"], body["value"]) == ("r-1", due, "dg==")
    assert entry.delay_seconds == 0


def test_with_no_watermark_at_all_the_message_is_redriven(p: Pipeline) -> None:
    assert cleanup(p).handle(removal(p, NOW_MS - 86_400_000)) is Outcome.REDRIVEN


def test_a_scheduled_message_is_not_redriven_and_its_payload_stays(p: Pipeline) -> None:
    # Another copy (a duplicate, a retry, a dead letter) may still need the value: only the
    # bucket's lifecycle removes it.
    due = NOW_MS - 86_400_000
    key = payload_key(removed_request(due))
    p.aws.s3.put_object(Bucket=p.settings.payload_bucket, Key=key, Body=b"big")
    p.store.create_watermark(buckets.due_second(NOW_MS), NOW_MS, p.deadline())
    ref = f"s3://{p.settings.payload_bucket}/{key}"
    assert cleanup(p).handle(removal(p, due, ref=ref)) is Outcome.CLEANED
    assert p.delayed() == []
    listed = p.aws.s3.list_objects_v2(Bucket=p.settings.payload_bucket, Prefix="payloads/")
    assert [o["Key"] for o in listed["Contents"]] == [key]


def test_a_message_in_a_late_range_is_redriven_though_the_watermark_passed_it(
    p: Pipeline,
) -> None:
    # The scheduler passed its second after TTL may have deleted it: it may never have been
    # read, so it is delivered now (at worst a duplicate with the same delay-id).
    due = NOW_MS - 86_400_000
    second = buckets.due_second(due)
    start = p.store.create_watermark(second - 10, NOW_MS, p.deadline())
    p.store.write_watermark(
        start, Watermark(second + 100, late=((second - 5, second + 5),)), NOW_MS, p.deadline()
    )
    assert cleanup(p).handle(removal(p, due)) is Outcome.REDRIVEN
    assert cleanup(p).handle(removal(p, due - 6_000)) is Outcome.CLEANED
    assert len(p.delayed()) == 1


def test_when_the_watermark_cannot_be_read_the_message_is_redriven(p: Pipeline) -> None:
    def get_item(**_: Any) -> Any:
        raise client_error("AccessDeniedException")

    p.store.create_watermark(buckets.due_second(NOW_MS), NOW_MS, p.deadline())
    q = p.with_store_client(ClientProxy(p.aws.dynamodb, get_item=get_item))
    assert cleanup(q).handle(removal(q, NOW_MS - 86_400_000)) is Outcome.REDRIVEN
    assert len(q.delayed()) == 1


def test_a_redrive_that_fails_raises_so_the_stream_retries_the_record(p: Pipeline) -> None:
    def send_message_batch(**_: Any) -> Any:
        raise client_error("AccessDenied")

    refusing = DelayQueue(
        SqsQueue(as_sqs_client(ClientProxy(p.aws.sqs, send_message_batch=send_message_batch)), "q"),
        0,
    )
    services = CleanupServices(p.store, refusing)
    with pytest.raises(DelayQueueError):
        TtlCleanup(services, clock=p.clock, deadline=p.deadline()).handle(
            removal(p, NOW_MS - 86_400_000)
        )


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
