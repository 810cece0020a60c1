"""`delayq get`'s reads (delayq_local.lookup): what the table says about one id, after the real
ingest wrote it."""

from __future__ import annotations

from typing import Any

from delayq.retry import Deadline
from delayq_local.lookup import UNKNOWABLE, locate
from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from tests.functional.conftest import Pipeline

DUE_MS = NOW_MS + 1_200_000  # beyond the pipeline's horizon: stored


def record(offset: int, **headers: Any) -> dict[str, Any]:
    return kafka_record(offset=offset, timestamp=NOW_MS + offset, **headers)


def test_a_stored_message_is_found_with_its_due_time(pipeline: Pipeline) -> None:
    pipeline.ingest(
        kafka_event(record(1, target="reminders", deliver_at=str(DUE_MS), id="g-1", value=b"12345"))
    )

    found = locate(pipeline.store, "g-1", DUE_MS, Deadline.after(10))

    assert found.found
    assert found.marker is None
    assert found.dropped is False
    assert found.stored is not None
    assert (found.stored.target, found.stored.due_ms) == ("reminders", DUE_MS)
    assert found.second_scheduled is False
    answer = found.as_json()
    assert answer["stored"]["bytes"] == 5
    assert answer["unknowable"] == list(UNKNOWABLE)
    assert any("waiting" in line for line in found.lines())


def test_a_cancelled_message_is_found_and_said_to_be_dropped(pipeline: Pipeline) -> None:
    pipeline.ingest(
        kafka_event(
            record(1, target="reminders", deliver_at=str(DUE_MS), id="g-2"),
            record(2, cancel="g-2"),
        )
    )

    found = locate(pipeline.store, "g-2", DUE_MS, Deadline.after(10))

    assert found.marker is not None
    assert found.marker.cancel is not None
    assert found.dropped is True
    assert found.as_json()["cancel"]["written_ms"] == NOW_MS + 2
    assert any(line.strip().startswith("cancelled") for line in found.lines())


def test_without_a_due_time_only_the_control_record_is_read(pipeline: Pipeline) -> None:
    pipeline.ingest(kafka_event(record(1, target="reminders", deliver_at=str(DUE_MS), id="g-3")))

    found = locate(pipeline.store, "g-3", None, Deadline.after(10))

    assert not found.found
    assert found.stored is None
    assert found.dropped is None
    assert any("pass --due" in line for line in found.lines())


def test_an_unknown_id_is_not_found(pipeline: Pipeline) -> None:
    found = locate(pipeline.store, "nobody", DUE_MS, Deadline.after(10))

    assert not found.found
    assert found.as_json()["stored"] is None
