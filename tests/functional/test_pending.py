"""Pending counts kept by ingest (delayq.pending) on moto: per release minute and target,
stored and queued apart, each record counted once under redelivery and re-batching, moved by
reschedules, and not kept when turned off."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from delayq import constants as c
from delayq.exceptions import StoreError
from delayq.pending import (
    PendingCount,
    PendingCounts,
    PendingTally,
    minute_of,
    period_of,
)
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq_local.pending_view import group_counts
from testkit.aws import as_dynamodb_client
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.events import kafka_event, kafka_record
from tests.factories import ClientProxy, client_error
from tests.functional.conftest import Pipeline

HOUR_MS = 3600_000
STORED_DUE = NOW_MS + 2 * HOUR_MS  # beyond the pipeline's horizon (300 s): stored
QUEUED_DUE = NOW_MS + 120_000  # within it: queued


def record(offset: int, due_ms: int, target: str = "orders.paid", partition: int = 0) -> Any:
    return kafka_record(
        offset=offset,
        partition=partition,
        timestamp=NOW_MS + offset,
        target=target,
        deliver_at=str(due_ms),
        id=f"m-{partition}-{offset}",
    )


def counts(p: Pipeline) -> dict[tuple[tuple[int, int], str], tuple[int, int]]:
    """``((first minute, minutes), target) -> (stored, queued)`` of every count from now on,
    for 7 days."""
    assert p.pending is not None
    first = minute_of(p.clock())
    return {
        ((n.minute, n.minutes), n.target): (n.stored, n.queued)
        for n in p.pending.read(first, first + 7 * 1440, p.deadline())
    }


def at(due_ms: int, sent_ms: int = NOW_MS) -> tuple[int, int]:
    """The period a message sent at ``sent_ms`` for ``due_ms`` is counted in."""
    return period_of(due_ms, sent_ms)


def test_ingest_counts_what_it_stored_and_queued_per_minute_and_target(p: Pipeline) -> None:
    result = p.ingest(
        kafka_event(
            record(0, STORED_DUE),
            record(1, STORED_DUE + 10),
            record(2, STORED_DUE, target="reminders"),
            record(3, QUEUED_DUE),
            record(4, STORED_DUE + HOUR_MS),
        )
    )
    assert (result.stored, result.queued) == (4, 1)
    assert counts(p) == {
        (at(STORED_DUE), "orders.paid"): (2, 0),
        (at(STORED_DUE), "reminders"): (1, 0),
        (at(QUEUED_DUE), "orders.paid"): (0, 1),
        (at(STORED_DUE + HOUR_MS), "orders.paid"): (1, 0),
    }
    # One write per item and target the batch touched (all records on one partition): the
    # hours of one day for each target, the minutes of one hour for the queued one.
    assert result.pending_updates == 3


def test_a_redelivered_batch_is_counted_once(p: Pipeline) -> None:
    event = kafka_event(*(record(i, STORED_DUE) for i in range(5)), record(5, QUEUED_DUE))
    p.ingest(event)
    again = p.ingest(event)
    assert again.stored == 5  # the messages are kept again (idempotent) ...
    assert counts(p) == {  # ... but counted once
        (at(STORED_DUE), "orders.paid"): (5, 0),
        (at(QUEUED_DUE), "orders.paid"): (0, 1),
    }


def test_a_redelivery_cut_into_other_batches_counts_only_the_records_not_yet_counted(
    p: Pipeline,
) -> None:
    p.ingest(kafka_event(*(record(i, STORED_DUE) for i in range(10))))
    # Kafka hands the partition out again from offset 5, in a batch reaching further.
    p.ingest(kafka_event(*(record(i, STORED_DUE) for i in range(5, 15))))
    p.ingest(kafka_event(*(record(i, STORED_DUE) for i in range(15, 17))))
    assert counts(p) == {(at(STORED_DUE), "orders.paid"): (17, 0)}


def test_partitions_count_into_one_minute_independently(p: Pipeline) -> None:
    # Partition 1 is far ahead of partition 0: its offsets do not hide partition 0's.
    p.ingest(kafka_event(*(record(100 + i, STORED_DUE, partition=1) for i in range(3))))
    p.ingest(kafka_event(*(record(i, STORED_DUE, partition=0) for i in range(2))))
    p.ingest(kafka_event(*(record(i, STORED_DUE, partition=0) for i in range(2))))
    assert counts(p) == {(at(STORED_DUE), "orders.paid"): (5, 0)}


def test_a_reschedule_moves_the_count_to_the_new_minute_once(p: Pipeline) -> None:
    p.ingest(kafka_event(record(0, STORED_DUE), record(1, STORED_DUE)))
    later = STORED_DUE + 3 * HOUR_MS
    move = kafka_record(
        offset=2,
        timestamp=NOW_MS + 2,
        reschedule="m-0-0",
        was_due=str(STORED_DUE),
        deliver_at=str(later),
    )
    assert p.ingest(kafka_event(move)).rescheduled == 1
    assert p.ingest(kafka_event(move)).rescheduled == 0  # redelivered: done already
    assert counts(p) == {
        (at(STORED_DUE), "orders.paid"): (1, 0),
        (at(later), "orders.paid"): (1, 0),
    }


def test_a_failed_count_fails_the_batch_and_its_redelivery_counts_it_once(p: Pipeline) -> None:
    # Two items: a day of hours (stored) and an hour of minutes (queued); the second write fails.
    event = kafka_event(record(0, STORED_DUE), record(1, QUEUED_DUE))
    real = as_dynamodb_client(p.aws.dynamodb)
    writes: list[int] = []

    def second_write_fails(**kwargs: Any) -> Any:
        writes.append(1)
        if len(writes) == 2:
            raise client_error("AccessDeniedException", operation="UpdateItem")
        return real.update_item(**kwargs)

    failing = PendingCounts(
        as_dynamodb_client(ClientProxy(real, update_item=second_write_fails)),
        p.settings.table_name,
        backoff=no_sleep_backoff(),
    )
    with pytest.raises(StoreError, match="count pending"):
        dataclasses.replace(p, pending=failing).ingest(event)
    p.ingest(event)  # Kafka redelivers the batch: the first item was counted already
    assert counts(p) == {
        (at(STORED_DUE), "orders.paid"): (1, 0),
        (at(QUEUED_DUE), "orders.paid"): (0, 1),
    }


def test_no_counts_are_kept_when_turned_off(p: Pipeline) -> None:
    result = dataclasses.replace(p, pending=None).ingest(kafka_event(record(0, STORED_DUE)))
    assert result.stored == 1
    assert result.pending_updates == 0
    items = p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
    assert not [i for i in items if i["pk"]["S"].startswith(c.PENDING_PK_PREFIX)]


def test_requests_without_coordinates_are_counted_each_time(p: Pipeline) -> None:
    """Layer callers that build requests themselves (no topic-partition-offset) have no
    offsets to remember: each call counts."""
    assert p.pending is not None
    request = DelayRequest(
        delay_id="lib-1",
        target="orders.paid",
        due_ms=STORED_DUE,
        key=None,
        value=b"x",
        headers=(),
        src="from-a-library",
    )
    for _ in range(2):
        tally = PendingTally()
        tally.kept([request], queued=False)
        p.pending.add(tally, Deadline.after(5))
    # Sent at an unknown time (no record timestamp): counted in its minute.
    assert counts(p) == {((minute_of(STORED_DUE), 1), "orders.paid"): (2, 0)}


def test_reading_spans_days_and_pages(p: Pipeline) -> None:
    """Seven days of minutes, several targets: one Query per day, pages followed."""
    assert p.pending is not None
    first = minute_of(p.clock())
    tally = PendingTally()
    expected = {}
    for n in range(0, 7 * 1440, 37):
        for target in ("orders.paid", "reminders"):
            tally.kept(
                [
                    DelayRequest(
                        delay_id=f"x-{n}-{target}",
                        target=target,
                        due_ms=(first + n) * 60_000,
                        key=None,
                        value=None,
                        headers=(),
                        src=f"delay-requests-0-{n}",
                    )
                ],
                queued=False,
            )
            expected[((first + n, 1), target)] = (1, 0)
    p.pending.add(tally, Deadline.after(120))
    assert counts(p) == expected
    by_day = group_counts(p.pending.read(first, first + 7 * 1440, p.deadline()), "day", "reminders")
    assert sum(g.stored for g in by_day) == len(expected) // 2
    assert all(g.target == "reminders" and g.minute % 1440 == 0 for g in by_day)
    assert all(g.minutes == 1440 for g in by_day)


def test_group_counts_sums_periods_keeps_longer_ones_whole_and_leaves_out_empty_ones() -> None:
    minute = 60 * 24 * 20_000  # a day's first minute
    raw = [
        PendingCount(minute + 1, 1, "orders.paid", 2, 1),
        PendingCount(minute + 59, 1, "orders.paid", 1, 0),
        PendingCount(minute + 61, 1, "orders.paid", 0, 4),
        PendingCount(minute + 61, 1, "reminders", 3, 0),
        PendingCount(minute + 120, 1, "reminders", 0, 0),  # everything moved away
        PendingCount(minute + 60, 60, "orders.paid", 5, 0),  # sent hours ahead
        PendingCount(minute, 1440, "orders.paid", 7, 0),  # sent days ahead
    ]
    assert group_counts(raw, "hour") == [
        PendingCount(minute, 60, "orders.paid", 3, 1),
        PendingCount(minute, 1440, "orders.paid", 7, 0),
        PendingCount(minute + 60, 60, "orders.paid", 5, 4),
        PendingCount(minute + 60, 60, "reminders", 3, 0),
    ]
    assert group_counts(raw, "minute", "orders.paid")[-1] == PendingCount(
        minute + 61, 1, "orders.paid", 0, 4
    )
    assert PendingCount(minute + 60, 60, "orders.paid", 5, 0) in group_counts(raw, "minute")
    assert group_counts(raw, "day", "orders.paid") == [
        PendingCount(minute, 1440, "orders.paid", 15, 5)
    ]
    assert group_counts(raw, "minute", "nobody") == []


def test_how_far_ahead_a_message_was_sent_sets_its_period() -> None:
    release = 28_999_980 * 60_000 + 37 * 60_000 + 123  # 37 minutes into an hour
    minute = minute_of(release)
    assert period_of(release, release - 3600_000) == (minute, 1)
    assert period_of(release, release - 3600_001) == (minute - 37, 60)
    assert period_of(release, release - 86_400_000) == (minute - 37, 60)
    day_start = minute - minute % 1440
    assert period_of(release, release - 86_400_001) == (day_start, 1440)
    assert period_of(release, 0) == (minute, 1)  # sent at an unknown time
    assert period_of(release, release + 5000) == (minute, 1)  # sent after its due time
