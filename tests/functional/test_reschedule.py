"""Reschedule by id through the pipeline: later, earlier, into the direct window, unknown ids,
cancels before and after, redelivered records, too late, and ids reused after a reschedule."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from delayq import buckets
from delayq import constants as c
from delayq.emitter import EmitResult
from delayq.envelope import decode_body
from delayq.exceptions import DelayQueueError
from delayq.ingest import IngestResult
from testkit.clock import NOW_MS
from testkit.events import kafka_event, kafka_record
from tests.factories import ClientProxy, LateWrites
from tests.functional.conftest import Pipeline

OLD_DUE_MS = NOW_MS + 1200_000  # beyond the pipeline's horizon (300 s): stored
LATER_MS = NOW_MS + 2400_000
EARLIER_MS = NOW_MS + 600_000


def ingest(p: Pipeline, *records: dict[str, Any], direct: bool = False) -> IngestResult:
    """One ingest batch (with the direct path when ``direct``)."""
    return p.ingest(kafka_event(*records), direct=direct)


def send(offset: int = 1, delay_id: str = "r-1", due_ms: int = OLD_DUE_MS, **kw: Any) -> Any:
    return kafka_record(
        offset=offset,
        timestamp=NOW_MS + offset,
        target="reminders",
        deliver_at=str(due_ms),
        id=delay_id,
        value=f"payload of {delay_id} at {offset}".encode(),
        **kw,
    )


def move(
    offset: int,
    new_due_ms: int,
    *,
    was_due_ms: int = OLD_DUE_MS,
    delay_id: str = "r-1",
    partition: int = 0,
    timestamp: int | None = None,
) -> Any:
    return kafka_record(
        offset=offset,
        partition=partition,
        timestamp=NOW_MS + offset if timestamp is None else timestamp,
        reschedule=delay_id,
        was_due=str(was_due_ms),
        deliver_at=str(new_due_ms),
    )


def cancel(offset: int, *, delay_id: str = "r-1", partition: int = 0, timestamp: int = 0) -> Any:
    return kafka_record(
        offset=offset, partition=partition, timestamp=timestamp or NOW_MS + offset, cancel=delay_id
    )


def deliver_around(p: Pipeline, due_ms: int) -> EmitResult:
    """Let the scheduler queue what is due at ``due_ms`` (the seconds before it are empty, as
    a scheduler that ran every minute would have found), then emit whatever SQS releases."""
    p.clock.now_ms = max(p.clock.now_ms, due_ms - p.settings.lookahead_seconds * 1000)
    mark = p.store.read_watermark(p.deadline())
    target = buckets.due_second(due_ms) - 2
    if mark is None or mark.second < target:
        p.set_watermark(target)
    p.schedule()
    return p.deliver_released()


def emitted(p: Pipeline) -> list[tuple[str, int, bytes | None]]:
    """``(id, due time header, value)`` of every produced record, in order."""
    return [
        (
            o.header("delay-id").decode(),  # type: ignore[union-attr]
            int(o.header("delay-due-ms")),  # type: ignore[arg-type]
            o.value,
        )
        for o in p.producer.produced
    ]


def rejects(p: Pipeline) -> list[dict[str, Any]]:
    return p.aws.bodies(p.settings.reject_queue_url)


def test_a_message_moved_later_is_delivered_at_the_new_time_only(p: Pipeline) -> None:
    ingest(p, send())
    result = ingest(p, move(2, LATER_MS))
    assert result.rescheduled == 1
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1  # the old version, superseded
    assert emitted(p) == []
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]
    assert min(p.producer.produced_at) >= LATER_MS  # never early


def test_a_message_moved_earlier_is_delivered_at_the_new_time_only(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(2, EARLIER_MS))
    deliver_around(p, EARLIER_MS)
    assert emitted(p) == [("r-1", EARLIER_MS, b"payload of r-1 at 1")]
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1
    assert len(emitted(p)) == 1


def test_a_message_moved_within_the_horizon_is_queued_at_once(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(2, NOW_MS + 60_000))
    [entry] = p.delayed()
    [body] = decode_body(entry.body)
    assert body.request is not None
    assert (body.request.due_ms, body.request.moved_src) == (NOW_MS + 60_000, "delay-requests-0-2")
    p.deliver_released()
    assert emitted(p) == [("r-1", NOW_MS + 60_000, b"payload of r-1 at 1")]
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1


def test_a_message_moved_into_the_direct_window_is_produced_by_ingest(p: Pipeline) -> None:
    assert p.settings.direct_window_ms > 0
    ingest(p, send())
    result = ingest(p, move(2, NOW_MS), direct=True)
    assert [d.delay_id for d in result.deliveries] == ["r-1"]
    assert emitted(p) == [("r-1", NOW_MS, b"payload of r-1 at 1")]
    assert p.delayed() == []
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1
    assert len(emitted(p)) == 1


def test_an_unknown_id_is_rejected_with_its_record(p: Pipeline) -> None:
    record = move(2, LATER_MS, delay_id="nobody")
    result = ingest(p, record)
    assert result.rescheduled == 0
    [reject] = rejects(p)
    assert reject["reason"] == "reschedule-not-found"
    assert "'nobody'" in reject["detail"]
    assert reject["record"] == record


def test_a_wrong_old_due_time_is_rejected_and_the_message_keeps_its_time(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(2, LATER_MS, was_due_ms=OLD_DUE_MS + 5000))
    assert [r["reason"] for r in rejects(p)] == ["reschedule-not-found"]
    deliver_around(p, OLD_DUE_MS)
    assert emitted(p) == [("r-1", OLD_DUE_MS, b"payload of r-1 at 1")]


def test_a_message_due_within_the_horizon_when_sent_cannot_be_moved(p: Pipeline) -> None:
    # It was queued, never stored: the reschedule says so and the message keeps its time.
    ingest(p, send(due_ms=NOW_MS + 60_000))
    ingest(p, move(2, LATER_MS, was_due_ms=NOW_MS + 60_000))
    [reject] = rejects(p)
    assert reject["reason"] == "reschedule-not-found"
    assert "due within the horizon" in reject["detail"]
    p.deliver_released()
    assert emitted(p) == [("r-1", NOW_MS + 60_000, b"payload of r-1 at 1")]


def test_a_cancel_after_a_reschedule_cancels_the_moved_message(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(2, LATER_MS))
    ingest(p, cancel(3))
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1
    assert deliver_around(p, LATER_MS).cancelled == 1
    assert emitted(p) == []


def test_a_reschedule_after_a_cancel_is_rejected(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, cancel(2))
    record = move(3, LATER_MS)
    ingest(p, record)
    [reject] = rejects(p)
    assert (reject["reason"], reject["record"]) == ("reschedule-cancelled", record)
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == []


def test_a_cancel_processed_after_a_later_reschedule_still_cancels(p: Pipeline) -> None:
    # Two partitions: the cancel was written first but ingest processes the reschedule
    # first. The copy keeps the original's record time, so the cancel covers it.
    ingest(p, send())
    ingest(p, move(7, LATER_MS, partition=1, timestamp=NOW_MS + 20))
    ingest(p, cancel(5, partition=2, timestamp=NOW_MS + 10))
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == []


def test_a_redelivered_reschedule_record_moves_the_message_once(p: Pipeline) -> None:
    ingest(p, send())
    record = move(2, LATER_MS)
    assert ingest(p, record).rescheduled == 1
    assert ingest(p, record).rescheduled == 0  # the copy it made is there already
    assert rejects(p) == []
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_a_crash_after_the_marker_completes_the_move_on_redelivery(p: Pipeline) -> None:
    # The marker was written, the copy was not: the retry moves the message even when it
    # comes after the cutoff, so the message is not lost.
    ingest(p, send())
    failing = ClientProxy(
        p.aws.dynamodb,
        batch_write_item=lambda **_: (_ for _ in ()).throw(RuntimeError("crash")),
    )
    crashed = p.with_store_client(failing)
    with pytest.raises(RuntimeError, match="crash"):
        crashed.ingest(kafka_event(move(2, LATER_MS)))
    p.clock.now_ms = OLD_DUE_MS - 1000  # after the cutoff
    assert ingest(p, move(2, LATER_MS)).rescheduled == 1
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_two_reschedules_of_one_id_the_later_record_wins_in_any_order(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(9, LATER_MS, partition=1, timestamp=NOW_MS + 30))
    result = ingest(p, move(4, EARLIER_MS, partition=2, timestamp=NOW_MS + 20))
    assert (result.rescheduled, rejects(p)) == (0, [])
    deliver_around(p, EARLIER_MS)
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_a_moved_message_can_be_moved_again(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(2, LATER_MS))
    ingest(p, move(3, EARLIER_MS, was_due_ms=LATER_MS))
    deliver_around(p, EARLIER_MS)
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", EARLIER_MS, b"payload of r-1 at 1")]


def test_a_reschedule_too_close_to_the_old_time_is_rejected_and_the_message_goes_once(
    p: Pipeline,
) -> None:
    ingest(p, send())
    p.clock.now_ms = OLD_DUE_MS - p.settings.max_hold_ms - 2000  # the cutoff
    record = move(2, LATER_MS, timestamp=p.clock.now_ms)
    ingest(p, record)
    [reject] = rejects(p)
    assert (reject["reason"], reject["record"]) == ("reschedule-too-late", record)
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", OLD_DUE_MS, b"payload of r-1 at 1")]


def test_a_reschedule_just_before_the_cutoff_is_applied(p: Pipeline) -> None:
    ingest(p, send())
    p.clock.now_ms = OLD_DUE_MS - p.settings.max_hold_ms - 2001
    assert ingest(p, move(2, LATER_MS, timestamp=p.clock.now_ms)).rescheduled == 1
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_a_message_reusing_the_id_after_a_reschedule_is_a_new_message(p: Pipeline) -> None:
    ingest(p, send())
    ingest(p, move(2, LATER_MS))
    ingest(p, send(offset=3, due_ms=EARLIER_MS))
    deliver_around(p, EARLIER_MS)
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [
        ("r-1", EARLIER_MS, b"payload of r-1 at 3"),
        ("r-1", LATER_MS, b"payload of r-1 at 1"),
    ]


def test_a_reschedule_does_not_move_a_message_sent_after_it(p: Pipeline) -> None:
    # The record at the old time reuses the id and came later: it is a new message.
    ingest(p, send(offset=5))
    ingest(p, move(2, LATER_MS))
    assert [r["reason"] for r in rejects(p)] == ["reschedule-not-found"]
    deliver_around(p, OLD_DUE_MS)
    assert emitted(p) == [("r-1", OLD_DUE_MS, b"payload of r-1 at 5")]


def test_a_reschedule_of_a_message_sent_in_the_same_batch_moves_it(p: Pipeline) -> None:
    assert ingest(p, send(), move(2, LATER_MS)).rescheduled == 1
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_an_offloaded_payload_moves_as_its_pointer(p: Pipeline) -> None:
    big = b"x" * (p.settings.offload_threshold_bytes + 1)
    ingest(p, {**send(), "value": base64.b64encode(big).decode()})
    ingest(p, move(2, LATER_MS))
    refs = [
        i["payload_ref"]["S"]
        for i in p.aws.dynamodb.scan(TableName=p.settings.table_name)["Items"]
        if "payload_ref" in i
    ]
    assert len(refs) == 2
    assert len(set(refs)) == 1  # both versions point at one payload
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, big)]


def test_an_offloaded_message_moved_into_the_direct_window_goes_whole_through_the_queue(
    p: Pipeline,
) -> None:
    # Ingest's direct path has no value to produce for a copy whose value waits in S3: the
    # copy goes to the delay queue as its pointer, and the emitter restores the value.
    big = b"x" * (p.settings.offload_threshold_bytes + 1)
    ingest(p, {**send(), "value": base64.b64encode(big).decode()})
    result = ingest(p, move(2, NOW_MS), direct=True)
    assert result.deliveries == []
    assert len(p.delayed()) == 1
    p.deliver_released()
    assert emitted(p) == [("r-1", NOW_MS, big)]
    assert deliver_around(p, OLD_DUE_MS).cancelled == 1
    assert len(emitted(p)) == 1


def test_a_message_never_rescheduled_makes_no_reschedule_request(p: Pipeline) -> None:
    # Every DynamoDB call ingest and the emitter make, counted: one batch write and the
    # watermark read at ingest; at the emitter one control-clock read per batch, which a
    # cancel needs already, then one seal per shard of its stored messages not sealed up to
    # their second yet (what makes a reschedule's late-landing marker fail) and a read of
    # those clocks again, and no marker read.
    db = p.aws.dynamodb
    operations = ("batch_get_item", "batch_write_item", "get_item", "put_item", "query")
    proxy = ClientProxy(db, update_item=db.update_item, **{o: getattr(db, o) for o in operations})
    counted = p.with_store_client(proxy)
    # At steady state, the watermark and the control clocks exist.
    counted.set_watermark(buckets.due_second(NOW_MS) - 1)
    counted.store.control_clocks(range(p.settings.shards), NOW_MS - 86_400_000, p.deadline())
    proxy.calls.clear()
    counted.ingest(kafka_event(send(), send(offset=2, delay_id="r-2")))
    assert [name for name, _ in proxy.calls] == ["batch_write_item", "get_item"]
    proxy.calls.clear()
    counted.clock.now_ms = OLD_DUE_MS - 60_000
    counted.set_watermark(buckets.due_second(OLD_DUE_MS) - 2)
    counted.schedule()
    proxy.calls.clear()
    counted.deliver_released()
    seals = [kw for name, kw in proxy.calls if name == "update_item"]
    assert {kw["Key"]["pk"]["S"].split("#")[0] for kw in seals} == {"clock"}
    assert len(seals) == len({buckets.shard_of(i, p.settings.shards) for i in ("r-1", "r-2")})
    others = [name for name, _ in proxy.calls if name not in ("put_item", "update_item")]
    assert others == ["batch_get_item", "batch_get_item"]
    reads = [kw for name, kw in proxy.calls if name == "batch_get_item"]
    keys = [k for kw in reads for k in kw["RequestItems"][p.settings.table_name]["Keys"]]
    assert {k["pk"]["S"].split("#")[0] for k in keys} == {"clock"}
    assert len(emitted(p)) == 2


@pytest.mark.parametrize(
    ("order", "delivered_at"),
    [
        # Lands after the emitter read the markers: refused, the old time only.
        (("emit", "land", "retry"), OLD_DUE_MS),
        # The retried batch refuses it first, then it lands: refused, the old time only.
        (("retry", "land", "emit"), OLD_DUE_MS),
        # Lands before the emitter reads: moved, the new time only (the retry completes it).
        (("land", "emit", "retry"), LATER_MS),
        (("land", "retry", "emit"), LATER_MS),
    ],
    ids=["emit-land-retry", "retry-land-emit", "land-emit-retry", "land-retry-emit"],
)
def test_a_reschedule_whose_write_lands_after_its_cutoff_moves_the_message_or_not_never_both(
    p: Pipeline, order: tuple[str, ...], delivered_at: int
) -> None:
    # The marker write is sent before the cutoff and times out; it takes effect later, before
    # or after the emitter reads the message's markers and the redelivered batch runs.
    ingest(p, send())
    cutoff = OLD_DUE_MS - p.settings.max_hold_ms - c.RESCHEDULE_MARGIN_MS
    p.clock.now_ms = cutoff - 1000
    record = move(2, LATER_MS, timestamp=cutoff - 1000)
    late = LateWrites(p.aws.dynamodb)
    with pytest.raises(DelayQueueError):
        p.with_store_client(late).ingest(kafka_event(record))
    assert late.held
    p.clock.now_ms = cutoff + 500
    for step in order:
        if step == "emit":
            deliver_around(p, OLD_DUE_MS)
        elif step == "land":
            late.land()
        else:
            ingest(p, record)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", delivered_at, b"payload of r-1 at 1")]
    if delivered_at == OLD_DUE_MS:
        [reject] = rejects(p)
        assert reject["reason"] == "reschedule-too-late"
    else:
        assert rejects(p) == []


def test_a_reschedule_whose_first_try_landed_before_the_seal_is_completed_by_its_second(
    p: Pipeline,
) -> None:
    # One ingest invocation: the marker's transaction times out (it lands later), the emitter
    # seals the second after it landed and drops the old version, and the retried
    # transaction fails on the seal: the move is completed all the same, never lost.
    ingest(p, send())
    cutoff = OLD_DUE_MS - p.settings.max_hold_ms - c.RESCHEDULE_MARGIN_MS
    p.clock.now_ms = cutoff - 10_000
    late = LateWrites(p.aws.dynamodb)
    tries: list[int] = []

    def transact(**kwargs: Any) -> Any:
        tries.append(1)
        if len(tries) == 1:
            return late.transact_write_items(**kwargs)  # held: times out
        now = p.clock.now_ms
        late.land()
        assert deliver_around(p, OLD_DUE_MS).cancelled == 1  # seals, reads the marker
        p.clock.now_ms = now
        return p.aws.dynamodb.transact_write_items(**kwargs)

    proxy = ClientProxy(p.aws.dynamodb, transact_write_items=transact)
    result = p.with_store_client(proxy).ingest(kafka_event(move(2, LATER_MS)))
    assert (len(tries), result.rescheduled, rejects(p)) == (2, 1, [])
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]


def test_a_chain_whose_last_step_was_recorded_is_completed_after_its_cutoff(p: Pipeline) -> None:
    # T0 -> T1 then T1 -> T2 in one batch: only the last step's marker is written; the copy's
    # write fails, and the batch comes again after T0's cutoff. The recorded chain is
    # completed (the first step is not refused as too late), so the message goes at T2.
    ingest(p, send())
    chain = [move(2, EARLIER_MS), move(3, LATER_MS, was_due_ms=EARLIER_MS)]
    failing = ClientProxy(
        p.aws.dynamodb,
        batch_write_item=lambda **_: (_ for _ in ()).throw(RuntimeError("crash")),
    )
    with pytest.raises(RuntimeError, match="crash"):
        p.with_store_client(failing).ingest(kafka_event(*chain))
    p.clock.now_ms = OLD_DUE_MS - 1000  # past the cutoffs of T0 (and of T1)
    assert ingest(p, *chain).rescheduled == 1
    assert rejects(p) == []
    deliver_around(p, EARLIER_MS)
    deliver_around(p, OLD_DUE_MS)
    deliver_around(p, LATER_MS)
    assert emitted(p) == [("r-1", LATER_MS, b"payload of r-1 at 1")]
