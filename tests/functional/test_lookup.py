"""`delayq get`'s reads (delayq_local.lookup): what the table says about one id, after the real
ingest wrote it."""

from __future__ import annotations

from typing import Any

from delayq.retry import Deadline
from delayq_local.lookup import UNKNOWABLE, locate, waiting
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


def test_without_the_index_or_a_due_time_only_the_control_record_is_read(
    pipeline: Pipeline,
) -> None:
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


def test_with_the_index_every_version_is_found_by_id_and_placed(indexed: Pipeline) -> None:
    soon_ms = NOW_MS + 120_000  # within the horizon: queued by ingest
    later_ms = DUE_MS + 600_000
    indexed.ingest(
        kafka_event(
            record(1, target="reminders", deliver_at=str(DUE_MS), id="g-4"),
            record(2, target="reminders", deliver_at=str(soon_ms), id="g-5"),
        )
    )
    indexed.ingest(kafka_event(record(3, reschedule="g-4", deliver_at=str(later_ms))))

    moved = locate(indexed.store, "g-4", None, Deadline.after(10))
    queued = locate(indexed.store, "g-5", None, Deadline.after(10))

    assert [(loc.due_ms, moved.state_of(loc)) for loc in moved.located] == [
        (DUE_MS, "dropped"),
        (later_ms, "waiting"),
    ]
    assert [e["state"] for e in moved.as_json()["indexed"]] == ["dropped", "waiting"]
    assert [loc.due_ms for loc in waiting(moved, NOW_MS)] == [later_ms]
    assert [queued.state_of(loc) for loc in queued.located] == ["queued"]
    assert [loc.due_ms for loc in waiting(queued, NOW_MS)] == [soon_ms]
    assert waiting(queued, soon_ms + 1) == []  # its time has passed: not waiting any more
    # Once the scheduler has passed its second, a stored message is in the delay queue.
    indexed.set_watermark(later_ms // 1000)
    sent = locate(indexed.store, "g-4", None, Deadline.after(10))
    assert sent.state_of(sent.located[1]) == "sent"
    # A cancel drops what was queued whole too (by its record time).
    indexed.ingest(kafka_event(record(4, cancel="g-5")))
    cancelled = locate(indexed.store, "g-5", None, Deadline.after(10))
    assert [cancelled.state_of(loc) for loc in cancelled.located] == ["dropped"]
    assert waiting(cancelled, NOW_MS) == []
