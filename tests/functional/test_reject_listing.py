"""`delayq rejects list` (delayq_local.reject_listing): the reject queue's records, decoded, left on
the queue."""

from __future__ import annotations

from delayq.retry import Deadline
from delayq_local.reject_listing import list_rejects
from delayq_local.source_queue import SourceQueue
from testkit.events import kafka_event, kafka_record
from tests.functional.conftest import Pipeline


def listing(p: Pipeline, limit: int = 10) -> tuple[list, list[str]]:  # type: ignore[type-arg]
    source = SourceQueue(p.aws.sqs, p.settings.reject_queue_url)
    return list_rejects(source, limit, Deadline.after(10), wait_seconds=0)


def test_rejected_records_are_listed_decoded_and_left_on_the_queue(pipeline: Pipeline) -> None:
    pipeline.ingest(
        kafka_event(
            kafka_record(offset=3, target="forbidden.topic", seconds="5", id="bad-1", value=b"hi"),
            kafka_record(offset=4, target="reminders", seconds="soon"),
        )
    )

    views, errors = listing(pipeline)
    again, _ = listing(pipeline)

    assert errors == []
    by_reason = {v.reason: v for v in views}
    assert set(by_reason) == {"target-not-allowed", "bad-due"}
    bad = by_reason["target-not-allowed"]
    assert (bad.delay_id, bad.coordinates, bad.value_bytes) == ("bad-1", "delay-requests-0-3", 2)
    assert ("delay-target", "forbidden.topic") in bad.headers
    assert bad.as_json()["headers"]["delay-id"] == "bad-1"
    assert any("forbidden.topic" in line for line in bad.lines())
    # Nothing was consumed: the same messages are there again.
    assert sorted(v.message_id for v in again) == sorted(v.message_id for v in views)


def test_the_limit_and_an_unreadable_body(pipeline: Pipeline) -> None:
    url = pipeline.settings.reject_queue_url
    for i in range(3):
        pipeline.aws.sqs.send_message(QueueUrl=url, MessageBody=f"not json {i}")

    views, _ = listing(pipeline, limit=2)

    assert len(views) == 2
    assert {v.reason for v in views} == {"unreadable"}
    assert views[0].detail.startswith("not json")
