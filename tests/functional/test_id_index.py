"""The id index (``DELAYQ_ID_INDEX=1``): every message ingest stores or queues has a locator,
so reschedules without ``delay-was-due`` and operators find it by id alone."""

from __future__ import annotations

from typing import Any

from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from tests.functional.conftest import Pipeline
from tests.functional.test_reschedule import (
    LATER_MS,
    OLD_DUE_MS,
    deliver_around,
    emitted,
    rejects,
    send,
)

SOON_MS = NOW_MS + 120_000  # within the pipeline's horizon (300 s): queued at once


def move_by_id(offset: int, new_due_ms: int, delay_id: str = "r-1") -> Any:
    """A reschedule without delay-was-due."""
    return kafka_record(
        offset=offset,
        timestamp=NOW_MS + offset,
        reschedule=delay_id,
        deliver_at=str(new_due_ms),
    )


def test_a_stored_message_is_moved_by_its_id_alone(indexed: Pipeline) -> None:
    indexed.ingest(kafka_event(send()))

    result = indexed.ingest(kafka_event(move_by_id(2, LATER_MS)))

    assert result.rescheduled == 1
    assert rejects(indexed) == []
    deliver_around(indexed, OLD_DUE_MS)
    assert emitted(indexed) == []
    deliver_around(indexed, LATER_MS)
    assert emitted(indexed) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_a_chain_by_id_in_one_batch_ends_at_its_last_time(indexed: Pipeline) -> None:
    indexed.ingest(kafka_event(send()))
    last_ms = LATER_MS + 600_000

    indexed.ingest(kafka_event(move_by_id(2, LATER_MS), move_by_id(3, last_ms)))

    assert rejects(indexed) == []
    deliver_around(indexed, LATER_MS)
    assert emitted(indexed) == []
    deliver_around(indexed, last_ms)
    assert emitted(indexed) == [("r-1", last_ms, b"payload of r-1 at 1")]


def test_a_moved_message_is_moved_again_by_id(indexed: Pipeline) -> None:
    indexed.ingest(kafka_event(send()))
    indexed.ingest(kafka_event(move_by_id(2, LATER_MS)))
    last_ms = LATER_MS + 600_000

    indexed.ingest(kafka_event(move_by_id(3, last_ms)))

    assert rejects(indexed) == []
    deliver_around(indexed, last_ms)
    assert emitted(indexed) == [("r-1", last_ms, b"payload of r-1 at 1")]


def test_a_message_sent_after_the_reschedule_is_not_moved(indexed: Pipeline) -> None:
    indexed.ingest(kafka_event(move_by_id(2, LATER_MS)))
    indexed.ingest(kafka_event(send(offset=3)))

    [refused] = rejects(indexed)
    assert refused["reason"] == "reschedule-not-found"
    assert "id index" in refused["detail"]
    deliver_around(indexed, OLD_DUE_MS)
    assert emitted(indexed) == [("r-1", OLD_DUE_MS, b"payload of r-1 at 3")]


def test_a_queued_message_is_located_but_cannot_be_moved(indexed: Pipeline) -> None:
    indexed.ingest(kafka_event(send(due_ms=SOON_MS)))

    located = indexed.store.located(["r-1"], indexed.deadline())["r-1"]
    indexed.ingest(kafka_event(move_by_id(2, LATER_MS)))

    assert [(loc.due_ms, loc.queued, loc.stored) for loc in located] == [(SOON_MS, True, None)]
    assert [r["reason"] for r in rejects(indexed)] == ["reschedule-not-found"]


def test_located_shows_each_stored_version_and_its_record_time(indexed: Pipeline) -> None:
    indexed.ingest(kafka_event(send()))
    indexed.ingest(kafka_event(move_by_id(2, LATER_MS)))

    located = indexed.store.located(["r-1", "r-2"], indexed.deadline())

    assert located["r-2"] == []
    versions = sorted(located["r-1"], key=lambda loc: loc.due_ms)
    assert [(loc.due_ms, loc.ts_ms, loc.queued) for loc in versions] == [
        (OLD_DUE_MS, NOW_MS + 1, False),
        (LATER_MS, NOW_MS + 1, False),
    ]
    assert [loc.stored.due_ms if loc.stored else None for loc in versions] == [
        OLD_DUE_MS,
        LATER_MS,
    ]


def test_without_the_index_a_reschedule_needs_its_old_due_time(pipeline: Pipeline) -> None:
    pipeline.ingest(kafka_event(send()))

    pipeline.ingest(kafka_event(move_by_id(2, LATER_MS)))

    [refused] = rejects(pipeline)
    assert refused["reason"] == "missing-due"
    assert "IdIndex=0" in refused["detail"]
    deliver_around(pipeline, OLD_DUE_MS)
    assert emitted(pipeline) == [("r-1", OLD_DUE_MS, b"payload of r-1 at 1")]


def test_without_the_index_only_capped_messages_get_locators(pipeline: Pipeline) -> None:
    pipeline.ingest(kafka_event(send()))
    assert pipeline.store.located(["r-1"], pipeline.deadline()) == {"r-1": []}
