"""Scheduler: watermark-driven, catches up after missed ticks, repeated ticks are no-ops,
a crash loses nothing, a conflict stops cleanly."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from delayq import buckets
from delayq.envelope import decode_body
from delayq.queues import TickQueue
from delayq.retry import Deadline
from delayq.scheduler import CATCH_UP_CHECKPOINT_SECONDS, QUERY_CHUNK_SECONDS, fire_timer
from delayq.store import Watermark
from testkit.clock import NOW_MS, FakeClock
from testkit.events import kafka_event, kafka_record
from tests.factories import ClientProxy
from tests.functional.conftest import Pipeline


def store_due_in(p: Pipeline, *delays_s: int) -> list[str]:
    ids = [f"m-{i}" for i in range(len(delays_s))]
    p.ingest(
        kafka_event(
            *(
                kafka_record(offset=i, target="reminders", seconds=str(d), id=ids[i])
                for i, d in enumerate(delays_s)
            )
        )
    )
    p.pass_empty_seconds()
    return ids


def sent(p: Pipeline) -> list[tuple[str, int]]:
    """Each delay id sent to the delay queue (once per send; a body may be a bundle of
    several), with the DelaySeconds it was sent with."""
    return [
        (entry.request.delay_id, e.delay_seconds)
        for e in p.delayed()
        for entry in decode_body(e.body)
        if entry.request is not None
    ]


def sent_ids(p: Pipeline) -> list[str]:
    return [delay_id for delay_id, _ in sent(p)]


def emitted_ids(p: Pipeline) -> list[str]:
    return [o.header("delay-id").decode() for o in p.producer.produced]  # type: ignore[union-attr]


def test_first_run_queues_everything_within_the_look_ahead(p: Pipeline) -> None:
    store_due_in(p, 3600, 7200)
    p.clock.now_ms = NOW_MS + 3600_000 - p.settings.lookahead_seconds * 1000
    result = p.schedule()
    assert sent_ids(p) == ["m-0"]
    assert result.watermark_after == buckets.due_second(p.clock()) + p.settings.lookahead_seconds
    assert result.lag_seconds == 0


def test_sends_release_at_or_before_due(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - p.settings.lookahead_seconds * 1000 + 10_250
    p.schedule()
    [entry] = p.delayed()
    assert entry.release_ms <= NOW_MS + 3600_000
    assert entry.release_ms >= NOW_MS + 3600_000 - p.settings.emit_lead_ms - 1000


def test_a_repeated_tick_sends_nothing_twice(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    p.schedule()
    second = p.schedule()
    assert second.sent == 0
    assert sent_ids(p) == ["m-0"]


def test_missed_ticks_are_caught_up_and_overdue_messages_go_at_once(p: Pipeline) -> None:
    store_due_in(p, 1200, 1260, 1500)
    p.clock.now_ms = NOW_MS + 100_000
    p.schedule()  # the last run before an outage
    p.clock.now_ms = NOW_MS + 1300_000  # twenty ticks missed: two messages overdue
    result = p.schedule()
    assert sorted(sent_ids(p)) == ["m-0", "m-1", "m-2"]
    assert [d for i, d in sent(p) if i in ("m-0", "m-1")] == [0, 0]
    assert result.lag_seconds == 0


def test_a_cancelled_long_message_is_queued_but_never_emitted(p: Pipeline) -> None:
    store_due_in(p, 3600, 3600)
    p.ingest(kafka_event(kafka_record(offset=9, cancel="m-1")))
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    p.schedule()
    assert sorted(sent_ids(p)) == ["m-0", "m-1"]  # the scheduler reads no cancel markers
    delivered = p.deliver_released()
    assert emitted_ids(p) == ["m-0"]
    assert delivered.cancelled == 1


def test_a_cancel_that_arrives_after_scheduling_still_wins(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    p.schedule()
    p.ingest(kafka_event(kafka_record(offset=9, cancel="m-0")))
    assert p.deliver_released().cancelled == 1
    assert emitted_ids(p) == []


def test_the_scheduler_reads_no_cancel_markers(p: Pipeline) -> None:
    store_due_in(p, 3600, 3600)
    p.ingest(kafka_event(kafka_record(offset=9, cancel="m-1")))
    proxy = ClientProxy(p.aws.dynamodb, batch_get_item=p.aws.dynamodb.batch_get_item)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    p.with_store_client(proxy).schedule()
    assert proxy.calls == []


def test_a_crash_mid_run_loses_nothing_and_resends_at_most_one_second(p: Pipeline) -> None:
    store_due_in(p, 3600, 3601, 3602)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    p.sqs.raise_after = 1  # the second SendMessageBatch call crashes the invocation
    with pytest.raises(RuntimeError):
        p.schedule()
    assert sent_ids(p) == ["m-0"]
    mark = p.store.read_watermark(p.deadline())
    assert mark is not None
    assert mark.second == buckets.due_second(NOW_MS + 3600_000)
    p.sqs.raise_after = None
    p.schedule()
    assert sorted(sent_ids(p)) == ["m-0", "m-1", "m-2"]


def test_a_catch_up_that_dies_keeps_the_empty_seconds_it_passed(p: Pipeline) -> None:
    """After an hour without a run, a run that dies mid catch-up (here: a Query refused
    after 40 chunks) has recorded its progress every CATCH_UP_CHECKPOINT_SECONDS, so the next
    run does not read that hour again."""
    store_due_in(p, 7200)  # one message, far ahead: the hour before it is empty
    start = buckets.due_second(p.clock())
    p.set_watermark(start)
    p.clock.now_ms = NOW_MS + 3600_000
    queries: list[int] = []

    def query(**kwargs: object) -> object:
        queries.append(1)
        if len(queries) > 40 * QUERY_CHUNK_SECONDS * p.settings.shards:  # 40 chunks read
            raise RuntimeError("the invocation dies here")
        return p.aws.dynamodb.query(**kwargs)

    with pytest.raises(RuntimeError):
        p.with_store_client(ClientProxy(p.aws.dynamodb, query=query)).schedule()
    mark = p.store.read_watermark(p.deadline())
    assert mark is not None
    passed = 40 * QUERY_CHUNK_SECONDS
    assert mark.second >= start + passed - CATCH_UP_CHECKPOINT_SECONDS
    assert mark.second > start


def test_a_failed_batch_entry_is_resent_alone(p: Pipeline) -> None:
    store_due_in(p, 3600, 3600, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    p.sqs.fail_ids_once = {"0"}
    p.schedule()
    assert sorted(sent_ids(p)) == ["m-0", "m-1", "m-2"]


def test_out_of_time_stops_cleanly_and_the_next_tick_resumes(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    result = p.schedule(Deadline(lambda: 0))
    assert result.stopped_early
    assert p.delayed() == []
    p.schedule()
    assert sent_ids(p) == ["m-0"]


def test_a_scheduler_that_lost_the_race_stops_without_error(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    start = buckets.due_second(p.clock()) - 1
    p.set_watermark(start)
    real_read = p.store.read_watermark

    def stale_read(deadline: Deadline) -> Watermark | None:
        """Another scheduler moves the watermark between our read and our write."""
        mark = real_read(deadline)
        if mark is not None:
            p.store.write_watermark(mark, Watermark(start + 5000), NOW_MS, deadline)
        return mark

    p.store.read_watermark = stale_read  # type: ignore[method-assign]
    result = p.schedule()
    assert result.conflict
    after = real_read(p.deadline())
    assert after is not None
    assert after.second == start + 5000


def test_the_timer_sends_one_tick_per_period(p: Pipeline) -> None:
    ticks = TickQueue(p.aws.sqs, p.settings.tick_queue_url)
    first = fire_timer(tick_queue=ticks, settings=p.settings, clock=p.clock, deadline=p.deadline())
    p.clock.advance(30_000 - (p.clock() % 60_000) + 1000)
    again = fire_timer(tick_queue=ticks, settings=p.settings, clock=p.clock, deadline=p.deadline())
    got = p.aws.receive_all(p.settings.tick_queue_url)
    assert first == again
    assert len(got) == 1
    assert json.loads(got[0]["Body"])["tick"] == buckets.tick_index(NOW_MS, 60)


# --- AWS's weak semantics: TTL lag, the first run, the ingest guard ----------------------------


def test_a_scheduler_down_longer_than_the_grace_still_sends_what_ttl_has_not_deleted(
    p: Pipeline,
) -> None:
    # DynamoDB deletes expired items "within a few days": an item past its TTL is still
    # there, was never sent, and goes late rather than never.
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 + (p.settings.ttl_grace_seconds + 3600) * 1000
    result = p.schedule()
    assert sent_ids(p) == ["m-0"]
    assert result.late_seconds > 0
    mark = p.store.read_watermark(p.deadline())
    assert mark is not None
    due_second = buckets.due_second(NOW_MS + 3600_000)
    # ...and its second is recorded as passed late: if TTL had deleted a message of it before
    # the read, the cleanup function re-drives it when the removal comes through the stream.
    assert not mark.scheduled(due_second)


def test_seconds_passed_on_time_are_not_late(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    assert p.schedule().late_seconds == 0
    mark = p.store.read_watermark(p.deadline())
    assert mark is not None
    assert mark.late == ()
    assert mark.scheduled(buckets.due_second(NOW_MS + 3600_000))


def test_a_short_grace_with_its_clock_margin_passes_seconds_on_time(p: Pipeline) -> None:
    # A grace of a minute (the local stack's) with the default 300 s margin would count every
    # second as passed late, and the cleanup function would re-drive every TTL removal: a
    # duplicate of every stored message. The margin is a setting kept below the grace.
    short = dataclasses.replace(
        p, settings=p.settings.with_overrides(ttl_grace_seconds=60, ttl_clock_margin_seconds=5)
    )
    store_due_in(short, 3600)
    short.clock.now_ms = NOW_MS + 3600_000 + 30_000
    assert short.schedule().late_seconds == 0
    mark = short.store.read_watermark(short.deadline())
    assert mark is not None
    assert mark.scheduled(buckets.due_second(NOW_MS + 3600_000))


def test_a_scheduler_that_fails_for_its_first_hour_still_sends_what_was_stored(
    p: Pipeline,
) -> None:
    # No run before: the watermark ingest created (just before its first store) is where the
    # first run starts, not "now".
    p.ingest(kafka_event(kafka_record(target="reminders", seconds="1000", id="early")))
    p.clock.now_ms = NOW_MS + 3_600_000
    p.schedule()
    assert sent_ids(p) == ["early"]


def test_without_a_watermark_a_run_does_nothing(p: Pipeline) -> None:
    result = p.schedule()
    assert (result.sent, result.watermark_after, p.store.read_watermark(p.deadline())) == (
        0,
        None,
        None,
    )


def test_a_run_records_its_window_before_its_first_query(p: Pipeline) -> None:
    store_due_in(p, 3600)
    p.clock.now_ms = NOW_MS + 3600_000 - 60_000
    seen: list[int | None] = []

    def query(**kwargs: object) -> object:
        mark = p.store.read_watermark(p.deadline())
        seen.append(None if mark is None else mark.reading)
        return p.aws.dynamodb.query(**kwargs)

    q = p.with_store_client(ClientProxy(p.aws.dynamodb, query=query))
    q.schedule()
    window_end = buckets.due_second(p.clock()) + p.settings.lookahead_seconds
    assert seen
    assert set(seen) == {window_end}


def test_an_ingest_write_that_lands_after_the_schedulers_query_is_not_lost(
    p: Pipeline,
) -> None:
    """The race: ingest routed a message to the store (its clock 2 minutes behind, or its
    write retried that long), the scheduler reads that second before the write lands and
    passes it. The guard must catch it whatever the clocks and timeouts."""
    p.clock.now_ms = NOW_MS + 3600_000
    p.set_watermark(buckets.due_second(p.clock()) - 1)  # a scheduler that ran a minute ago
    due = p.clock() + p.settings.lookahead_seconds * 1000 - 5_000  # inside this run's window
    late_writer = dataclasses.replace(p, clock=FakeClock(p.clock() - 120_000))
    wrote: list[object] = []
    first = threading.Lock()

    def query(**kwargs: object) -> object:
        answer = p.aws.dynamodb.query(**kwargs)
        # The run's first Query has been answered: now the write lands (the run's queries
        # run in parallel: only one of them writes).
        if first.acquire(blocking=False):
            wrote.append(
                late_writer.ingest(
                    kafka_event(
                        kafka_record(
                            offset=50,
                            timestamp=late_writer.clock(),
                            target="reminders",
                            deliver_at=str(due),
                            id="raced",
                        )
                    )
                )
            )
        return answer

    q = p.with_store_client(ClientProxy(p.aws.dynamodb, query=query))
    q.schedule()
    [result] = wrote
    assert result.stored == 1  # type: ignore[attr-defined]
    assert "raced" in sent_ids(p)
