"""One id's records in any order: across partitions, in one batch or many, re-ingested. The
outcome depends on the records' own order (timestamp, then partition and offset), never on
the order ingest sees them in; no record's message or value overwrites another's."""

from __future__ import annotations

from typing import Any

from delayq.payloads import payload_key
from delayq.records import DelayRequest
from testkit.clock import NOW_MS
from testkit.events import kafka_record
from tests.functional.conftest import Pipeline
from tests.functional.test_reschedule import (
    LATER_MS,
    OLD_DUE_MS,
    cancel,
    deliver_around,
    emitted,
    ingest,
    move,
    rejects,
    send,
)

LARGE = 250_000  # over the offload threshold: the value waits in S3
WEEK_MS = 7 * 24 * 3_600_000


def send_value(offset: int, value: bytes, *, partition: int = 0) -> Any:
    return kafka_record(
        offset=offset,
        partition=partition,
        timestamp=NOW_MS + offset,
        target="reminders",
        deliver_at=str(OLD_DUE_MS),
        id="r-1",
        value=value,
    )


def large_send(offset: int, fill: bytes, *, partition: int = 0, due_ms: int = OLD_DUE_MS) -> Any:
    return kafka_record(
        offset=offset,
        partition=partition,
        timestamp=NOW_MS + offset,
        target="reminders",
        deliver_at=str(due_ms),
        id="r-1",
        value=fill * LARGE,
    )


def test_a_resent_id_on_another_partition_ingested_first_is_still_delivered(p: Pipeline) -> None:
    resent = send_value(3, b"second", partition=1)
    # The resend's partition is read first; the first send and its cancel come after.
    ingest(p, resent)
    ingest(p, send_value(1, b"first"), cancel(2))
    deliver_around(p, OLD_DUE_MS)
    assert emitted(p) == [("r-1", OLD_DUE_MS, b"second")]


def test_a_redriven_older_record_does_not_replace_a_newer_one(p: Pipeline) -> None:
    ingest(p, send_value(1, b"first"), cancel(2), send_value(3, b"second"))
    # The first record again (a redelivered batch, a redrive of rejects): nothing changes.
    ingest(p, send_value(1, b"first"))
    deliver_around(p, OLD_DUE_MS)
    assert emitted(p) == [("r-1", OLD_DUE_MS, b"second")]


def test_two_large_messages_with_one_id_and_due_keep_their_own_values(p: Pipeline) -> None:
    ingest(p, large_send(3, b"B", partition=1))
    ingest(p, large_send(1, b"A"), cancel(2))
    deliver_around(p, OLD_DUE_MS)
    [(delay_id, due, value)] = emitted(p)
    assert (delay_id, due, value) == ("r-1", OLD_DUE_MS, b"B" * LARGE)


def test_a_moved_large_message_keeps_its_value_when_the_id_is_reused_at_its_old_time(
    p: Pipeline,
) -> None:
    ingest(p, large_send(1, b"A"))
    ingest(p, move(2, LATER_MS))
    ingest(p, large_send(3, b"B"))  # a new message reusing the id at the old due time
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert sorted((due, (value or b"")[:1]) for _, due, value in emitted(p)) == [
        (OLD_DUE_MS, b"B"),
        (LATER_MS, b"A"),
    ]


def test_a_reschedule_chain_in_one_batch_ends_at_its_last_time(p: Pipeline) -> None:
    final_ms = LATER_MS + 600_000
    ingest(p, send(1))
    result = ingest(p, move(2, LATER_MS), move(3, final_ms, was_due_ms=LATER_MS))
    assert (result.rescheduled, rejects(p)) == (1, [])
    for due in (OLD_DUE_MS, LATER_MS, final_ms):
        deliver_around(p, due)
    assert emitted(p) == [("r-1", final_ms, b"payload of r-1 at 1")]


def test_a_redelivered_reschedule_chain_is_applied_once(p: Pipeline) -> None:
    final_ms = LATER_MS + 600_000
    chain = (move(2, LATER_MS), move(3, final_ms, was_due_ms=LATER_MS))
    ingest(p, send(1))
    ingest(p, *chain)
    again = ingest(p, *chain)
    assert (again.rescheduled, rejects(p)) == (0, [])
    for due in (OLD_DUE_MS, LATER_MS, final_ms):
        deliver_around(p, due)
    assert emitted(p) == [("r-1", final_ms, b"payload of r-1 at 1")]


def test_a_reschedule_chain_split_in_reverse_batches_ends_at_its_last_time(p: Pipeline) -> None:
    final_ms = LATER_MS + 600_000
    ingest(p, send(1))
    # The second reschedule's partition is read first: it refers to a time the message is
    # not at yet, and is refused; the first then moves it. The outcome follows the order in
    # which ingest can see them, with the refusal in the reject queue to redrive.
    ingest(p, move(3, final_ms, was_due_ms=LATER_MS, partition=1))
    ingest(p, move(2, LATER_MS))
    [refused] = rejects(p)
    assert refused["reason"] == "reschedule-not-found"


def test_cancels_of_one_millisecond_keep_the_later_offset_whatever_order(p: Pipeline) -> None:
    at = NOW_MS + 10
    message = kafka_record(
        offset=7, timestamp=at, target="reminders", deliver_at=str(OLD_DUE_MS), id="r-1"
    )
    ingest(p, message)
    ingest(p, cancel(9, timestamp=at))  # covers offset 7
    ingest(p, cancel(5, timestamp=at))  # does not; must not replace the later cancel
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1
    assert emitted(p) == []


def test_a_snoozed_large_message_outlives_its_first_payload_object(p: Pipeline) -> None:
    # Four reschedules a week apart: the last copy is released four weeks after the record,
    # longer than the bucket keeps the first object (the maximum delay plus margins).
    ingest(p, large_send(1, b"A"))
    due = OLD_DUE_MS
    for step in range(1, 5):
        p.clock.now_ms = max(p.clock.now_ms + 1000, due - 3_600_000)
        new_due = p.clock.now_ms + WEEK_MS - 60_000
        result = ingest(
            p,
            kafka_record(
                offset=10 + step,
                timestamp=p.clock.now_ms,
                reschedule="r-1",
                was_due=str(due),
                deliver_at=str(new_due),
            ),
        )
        assert result.rescheduled == 1, rejects(p)
        due = new_due
    # The bucket's lifecycle rule expires the first object before the last release.
    first = payload_key(
        DelayRequest("r-1", "reminders", OLD_DUE_MS, None, None, (), "delay-requests-0-1")
    )
    p.aws.s3.delete_object(Bucket=p.settings.payload_bucket, Key=first)
    p.clock.now_ms = due - p.settings.lookahead_seconds * 1000
    p.set_watermark(due // 1000 - 2)
    p.schedule()
    p.deliver_released()
    assert [(d, (v or b"")[:1]) for _, d, v in emitted(p)] == [(due, b"A")]
    assert p.dead_lettered() == []
