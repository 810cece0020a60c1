"""Scheduler, crowded due-seconds: more messages in one second than one run can send.

A second is read a page per shard at a time, each round is sent before the next is read, and
the cursors are recorded after each round: runs that stop at their deadline, crash or race
each other make progress inside the second, send every message at least once, and re-send at
most the round in flight (one page per shard).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from delayq import buckets
from delayq.envelope import decode_body
from delayq.queues import DelayQueue
from delayq.records import DelayRequest
from delayq.retry import Deadline
from delayq.scheduler import ScheduleResult, run_scheduler
from delayq.store import Watermark
from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from tests.factories import ClientProxy
from tests.functional.conftest import Pipeline

DUE_MS = NOW_MS + 3_600_000
DUE_S = buckets.due_second(DUE_MS)


def crowd(p: Pipeline, count: int, *, page_items: int) -> list[str]:
    """``count`` messages due in the same second, and a scheduler reading ``page_items`` a
    page; the clock one minute before they are due (inside the look-ahead)."""
    p.settings = p.settings.with_overrides(scheduler_page_items=page_items)
    ids = [f"c-{i:03}" for i in range(count)]
    records = [
        kafka_record(offset=i, target="reminders", seconds="3600", id=delay_id)
        for i, delay_id in enumerate(ids)
    ]
    p.ingest(kafka_event(*records))
    p.pass_empty_seconds()
    p.clock.now_ms = DUE_MS - 60_000
    return ids


def round_size(p: Pipeline) -> int:
    """The most messages one round holds: a page from every shard."""
    return p.settings.shards * p.settings.scheduler_page_items


def sent(p: Pipeline) -> Counter[str]:
    """How often each delay id went to the delay queue (a body may be a bundle of several)."""
    return Counter(
        entry.request.delay_id
        for e in p.delayed()
        for entry in decode_body(e.body)
        if entry.request is not None
    )


def budget(p: Pipeline, calls: int) -> Deadline:
    """A deadline that runs out once this many more SendMessageBatch calls have been made."""
    start = p.sqs.calls
    return Deadline(lambda: 60_000 if p.sqs.calls - start < calls else 0)


def mark(p: Pipeline) -> Watermark:
    found = p.store.read_watermark(p.deadline())
    assert found is not None
    return found


def test_a_run_out_of_time_inside_a_second_records_where_it_stopped(p: Pipeline) -> None:
    crowd(p, 60, page_items=2)
    result = p.schedule(budget(p, 2))
    assert result.stopped_early
    assert result.sent == sum(sent(p).values()) > 0
    assert result.sent <= 2 * round_size(p)
    assert result.checkpoints >= 1
    progress = mark(p)
    assert progress.second == DUE_S - 1
    assert {buckets.parse_bucket_key(pk)[0] for pk in progress.cursors} == {DUE_S}
    assert result.watermark_after == DUE_S - 1


def test_a_crowded_second_is_drained_over_several_runs_each_resuming(p: Pipeline) -> None:
    ids = crowd(p, 60, page_items=2)
    proxy = ClientProxy(p.aws.dynamodb, query=p.aws.dynamodb.query)
    p = p.with_store_client(proxy)
    runs = 0
    while set(sent(p)) != set(ids):
        runs += 1
        assert runs < 20, "no progress"
        result = p.schedule(budget(p, 2))
        assert 0 < result.sent <= 2 * round_size(p)  # progress, within its deadline
    assert runs > 2
    assert sent(p) == Counter(ids)  # every message exactly once: stops are clean
    assert {kw["Limit"] for _, kw in proxy.calls} == {2}  # memory: a page per shard
    assert p.schedule().lag_seconds == 0
    assert mark(p).cursors == {}


class Dying(DelayQueue):
    """A delay queue whose invocation dies during its ``at``-th send, half of it sent."""

    def __init__(self, inner: DelayQueue, at: int) -> None:
        super().__init__(inner.queue, 0)
        self._inner = inner
        self._at = at
        self.sends = 0

    def send(self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline) -> None:
        self.sends += 1
        if self.sends == self._at:
            self._inner.send(requests[: len(requests) // 2], now_ms, deadline)
            raise RuntimeError("simulated crash of the invocation")
        self._inner.send(requests, now_ms, deadline)


def schedule_with(p: Pipeline, queue: DelayQueue) -> ScheduleResult:
    return run_scheduler(
        settings=p.settings,
        store=p.store,
        delay_queue=queue,
        clock=p.clock,
        deadline=p.deadline(),
    )


def test_runs_killed_inside_a_crowded_second_still_drain_it(p: Pipeline) -> None:
    ids = crowd(p, 100, page_items=5)  # rounds of at most 20 messages
    killed = 0
    progress: list[int] = []
    for _ in range(30):
        try:
            schedule_with(p, Dying(p.delay_queue, at=2))  # dies inside its second round
        except RuntimeError:
            killed += 1
            progress.append(len(sent(p)))
            continue
        break
    assert killed > 1
    assert progress == sorted(set(progress))  # every killed run sent messages never sent
    assert set(sent(p)) == set(ids)
    duplicates = sum(sent(p).values()) - len(ids)
    assert 0 < duplicates <= killed * round_size(p)  # at most the round in flight, per crash
    assert mark(p).cursors == {}


def test_a_rerun_after_a_crash_resends_at_most_the_round_in_flight(p: Pipeline) -> None:
    ids = crowd(p, 60, page_items=5)
    with pytest.raises(RuntimeError):
        schedule_with(p, Dying(p.delay_queue, at=3))
    before = sent(p)
    result = p.schedule()
    assert set(sent(p)) == set(ids)
    assert sum(sent(p).values()) - len(ids) <= round_size(p)
    assert result.sent <= len(ids) - len(before) + round_size(p)
    assert not result.stopped_early


class Interrupting(DelayQueue):
    """A delay queue during whose ``at``-th send another scheduler run happens."""

    def __init__(self, inner: DelayQueue, at: int, other: Callable[[], ScheduleResult]) -> None:
        super().__init__(inner.queue, 0)
        self._inner = inner
        self._at = at
        self._other = other
        self.sends = 0
        self.other: ScheduleResult | None = None

    def send(self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline) -> None:
        self._inner.send(requests, now_ms, deadline)
        self.sends += 1
        if self.sends == self._at:
            self.other = self._other()


@pytest.mark.parametrize("at", [1, 3], ids=["before-any-progress", "after-progress"])
def test_of_two_runs_in_one_crowded_second_the_loser_stops_at_its_next_write(
    p: Pipeline, at: int
) -> None:
    ids = crowd(p, 60, page_items=2)
    p.set_watermark(DUE_S - 1)
    queue = Interrupting(p.delay_queue, at, p.schedule)
    loser = schedule_with(p, queue)
    assert loser.conflict
    assert queue.sends == at  # it stopped at the write after the other run's
    assert queue.other is not None
    assert not queue.other.conflict
    assert queue.other.lag_seconds == 0
    assert set(sent(p)) == set(ids)
    assert sum(sent(p).values()) - len(ids) <= round_size(p)


def test_missed_ticks_with_a_crowded_second_are_caught_up_over_several_runs(
    p: Pipeline,
) -> None:
    p.settings = p.settings.with_overrides(scheduler_page_items=2)
    records = [
        kafka_record(offset=i, target="reminders", seconds="1200", id=f"c-{i:03}")
        for i in range(40)
    ]
    records += [
        kafka_record(offset=100, target="reminders", seconds="1190", id="before"),
        kafka_record(offset=101, target="reminders", seconds="1260", id="after"),
    ]
    p.ingest(kafka_event(*records))
    p.pass_empty_seconds()
    p.clock.now_ms = NOW_MS + 100_000
    p.schedule()  # the last run before an outage
    p.clock.now_ms = NOW_MS + 1300_000  # twenty ticks missed: everything overdue
    runs = 0
    while True:
        runs += 1
        assert runs < 20, "no progress"
        result = p.schedule(budget(p, 2))
        if not result.stopped_early:
            break
    assert runs > 1
    assert sent(p) == Counter({f"c-{i:03}": 1 for i in range(40)} | {"before": 1, "after": 1})
    assert result.lag_seconds == 0
    assert p.schedule().sent == 0  # and the next tick is a no-op
