"""Control clocks: the emitter reads an id's marker only when a control may apply, and every
control that applies is still found, in any order of writes (moto: its own expression
evaluation, not the fake's)."""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import pytest

from delayq import buckets
from delayq.control_clock import (
    BUCKETS_PER_SHARD,
    FLOOR_MARGIN_SECONDS,
    ControlClock,
    clock_key,
    shard_and_bucket,
)
from delayq.exceptions import DelayQueueError
from delayq.records import CancelRequest, DelayRequest, RescheduleRequest
from delayq.retry import Deadline
from delayq.store import MessageStore, RescheduleWrite, cancel_key
from testkit.aws import item_size, read_units, write_units
from testkit.clock import NOW_MS, no_sleep_backoff
from tests.factories import AwsResources, ClientProxy, LateWrites, delay_request

NOW_S = NOW_MS // 1000
HOUR_MS = 3_600_000
# A clock created two hours before NOW_MS: its floor is an hour behind the records below.
LONG_AGO_MS = NOW_MS - 2 * HOUR_MS


def deadline() -> Deadline:
    return Deadline.after(60)


def make_store(client: Any, aws: AwsResources) -> MessageStore:
    s = aws.settings
    return MessageStore(
        client,
        s.table_name,
        shards=s.shards,
        ttl_grace_seconds=s.ttl_grace_seconds,
        max_delay_seconds=s.max_delay_seconds,
        backoff=no_sleep_backoff(),
    )


def message(delay_id: str, ts_ms: int, offset: int = 1) -> DelayRequest:
    return replace(delay_request(delay_id=delay_id, src=f"delay-requests-0-{offset}"), ts_ms=ts_ms)


def cancel(delay_id: str, ts_ms: int, src: str = "delay-requests-1-7") -> CancelRequest:
    return CancelRequest(delay_id, src, ts_ms)


@pytest.fixture
def proxy(aws: AwsResources) -> ClientProxy:
    return ClientProxy(aws.dynamodb, batch_get_item=aws.dynamodb.batch_get_item)


def marker_keys_read(proxy: ClientProxy, aws: AwsResources) -> list[str]:
    table = aws.settings.table_name
    return [
        k["sk"]["S"]
        for _, kw in proxy.calls
        for k in kw["RequestItems"][table]["Keys"]
        if k["pk"]["S"].startswith("cancel#")
    ]


def clock_item(aws: AwsResources, shard: int) -> dict[str, Any]:
    item: dict[str, Any] = aws.dynamodb.get_item(
        TableName=aws.settings.table_name, Key=clock_key(shard), ConsistentRead=True
    )["Item"]
    return item


def test_a_shard_and_its_buckets_come_from_one_hash() -> None:
    for delay_id in ("order-1", "a", "r-1", "é" * 40):
        shard, bucket = shard_and_bucket(delay_id, 16)
        digest = zlib.crc32(delay_id.encode("utf-8"))
        assert shard == buckets.shard_of(delay_id, 16)
        assert bucket == f"b{digest // 16 % BUCKETS_PER_SHARD}"


def test_a_full_clock_costs_one_write_unit_to_raise_and_one_read_unit_to_read() -> None:
    item = {
        **clock_key(255),
        "kind": {"S": "clock"},
        "f": {"N": str(NOW_S)},
        **{f"b{i}": {"N": str(NOW_S + 10**8)} for i in range(BUCKETS_PER_SHARD)},
    }
    assert write_units(item_size(item)) == 1
    assert read_units(item_size(item), consistent=True) == 1


@pytest.mark.parametrize(
    ("clock_s", "record_ms", "may_apply"),
    [
        (NOW_S - 1, NOW_MS, False),  # every control is from an earlier second
        (NOW_S, NOW_MS + 999, True),  # one in the record's own second may be later
        (NOW_S + 5, NOW_MS, True),
    ],
)
def test_a_control_may_apply_from_the_records_own_second_on(
    clock_s: int, record_ms: int, may_apply: bool
) -> None:
    _, bucket = shard_and_bucket("r-1", 4)
    clock = ControlClock(floor=0, seconds={bucket: clock_s})
    assert clock.may_apply(message("r-1", record_ms), 4) is may_apply
    # The floor counts for every bucket.
    assert ControlClock(floor=clock_s).may_apply(message("r-1", record_ms), 4) is may_apply


def test_no_marker_is_read_when_no_control_was_written_since_the_records(
    aws: AwsResources, proxy: ClientProxy
) -> None:
    store = make_store(proxy, aws)
    store.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    proxy.calls.clear()
    batch = [message(f"order-{i}", NOW_MS) for i in range(300)]
    assert store.cancelled(batch, NOW_MS, deadline()) == [False] * 300
    assert marker_keys_read(proxy, aws) == []
    # One read of each shard's clock, strongly consistent (then, the shards sealed for the
    # batch's second, read again).
    table = aws.settings.table_name
    [first, again] = [kw["RequestItems"][table] for _, kw in proxy.calls]
    assert len(first["Keys"]) == aws.settings.shards
    assert first["ConsistentRead"] is again["ConsistentRead"] is True


def test_a_control_makes_the_markers_of_its_bucket_read_and_still_wins(
    aws: AwsResources, proxy: ClientProxy
) -> None:
    store = make_store(proxy, aws)
    store.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    store.put_cancels([cancel("order-7", NOW_MS + 5)], NOW_MS + 10, deadline())
    proxy.calls.clear()
    batch = [message(f"order-{i}", NOW_MS) for i in range(300)]
    flags = store.cancelled(batch, NOW_MS + 20, deadline())
    assert [r.delay_id for r, f in zip(batch, flags, strict=True) if f] == ["order-7"]
    # Only the ids that share order-7's bucket are read.
    shard, bucket = shard_and_bucket("order-7", aws.settings.shards)
    same = [r.delay_id for r in batch if shard_and_bucket(r.delay_id, 4) == (shard, bucket)]
    assert sorted(marker_keys_read(proxy, aws)) == sorted(same)
    assert len(same) < 10


def test_a_cancel_in_the_messages_own_second_is_read(aws: AwsResources) -> None:
    store = make_store(aws.dynamodb, aws)
    store.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    # Same millisecond, another partition: the tie goes to the cancel.
    store.put_cancels([cancel("r-1", NOW_MS + 400)], NOW_MS + 500, deadline())
    assert store.cancelled(
        [message("r-1", NOW_MS + 400), message("r-1", NOW_MS + 401)], NOW_MS + 600, deadline()
    ) == [True, False]


def test_the_clock_keeps_the_latest_second_whatever_order_controls_come_in(
    aws: AwsResources,
) -> None:
    store = make_store(aws.dynamodb, aws)
    shard, bucket = shard_and_bucket("r-1", aws.settings.shards)
    # A cancel and a reschedule from two partitions, the later record ingested first.
    store.put_cancels([cancel("r-1", NOW_MS + 50_000)], NOW_MS, deadline())
    store.put_reschedules(
        [
            (
                RescheduleRequest("r-1", NOW_MS, NOW_MS + HOUR_MS, "t-2-3", NOW_MS + 1_000),
                0,
                deadline(),
            )
        ],
        NOW_MS,
    )
    item = clock_item(aws, shard)
    assert item[bucket] == {"N": str(NOW_S + 50)}
    # Created by the first control, with a floor an hour past its creation.
    assert item["f"] == {"N": str(NOW_S + FLOOR_MARGIN_SECONDS)}
    assert item["kind"] == {"S": "clock"}
    # Raised by a reschedule too, and the same control again changes nothing.
    store.put_reschedules(
        [
            (
                RescheduleRequest("r-1", NOW_MS, NOW_MS + HOUR_MS, "t-2-4", NOW_MS + 90_000),
                0,
                deadline(),
            )
        ],
        NOW_MS,
    )
    store.put_reschedules(
        [
            (
                RescheduleRequest("r-1", NOW_MS, NOW_MS + HOUR_MS, "t-2-4", NOW_MS + 90_000),
                0,
                deadline(),
            )
        ],
        NOW_MS,
    )
    assert clock_item(aws, shard)[bucket] == {"N": str(NOW_S + 90)}


def test_a_marker_written_before_its_clock_existed_is_honoured(aws: AwsResources) -> None:
    # A stack upgraded from a release without clocks: markers, no clock items.
    aws.dynamodb.put_item(
        TableName=aws.settings.table_name,
        Item={
            **cancel_key("old", aws.settings.shards),
            "kind": {"S": "cancel"},
            "cancel_ts": {"N": str(NOW_MS + 1_000)},
            "cancel_src": {"S": "delay-requests-0-3"},
        },
    )
    store = make_store(aws.dynamodb, aws)
    assert store.cancelled([message("old", NOW_MS)], NOW_MS, deadline()) == [True]
    # The clock the read created counts it for an hour: later records are new messages.
    later = NOW_MS + (FLOOR_MARGIN_SECONDS + 1) * 1000
    assert store.cancelled([message("old", later)], later, deadline()) == [False]


def test_a_copy_of_a_message_moved_twice_is_dropped_by_the_later_reschedule(
    aws: AwsResources,
) -> None:
    store = make_store(aws.dynamodb, aws)
    store.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    first = RescheduleRequest("r-1", NOW_MS, NOW_MS + HOUR_MS, "t-0-2", NOW_MS + 10_000)
    second = RescheduleRequest(
        "r-1", NOW_MS + HOUR_MS, NOW_MS + 2 * HOUR_MS, "t-0-3", NOW_MS + 20_000
    )
    # One at a time: moto's conditional writes are not atomic across threads (DynamoDB's are).
    for reschedule in (first, second):
        store.put_reschedules([(reschedule, 0, deadline())], NOW_MS + 20_000)
    copy = replace(
        message("r-1", NOW_MS), due_ms=first.due_ms, moved_ts_ms=first.ts_ms, moved_src=first.src
    )
    assert store.cancelled([copy], NOW_MS + 30_000, deadline()) == [True]


def reschedule(ts_ms: int, src: str = "t-2-4") -> RescheduleRequest:
    return RescheduleRequest("r-1", NOW_MS, NOW_MS + HOUR_MS, src, ts_ms)


def test_a_marker_write_that_lands_after_the_emitter_sealed_its_second_changes_nothing(
    aws: AwsResources,
) -> None:
    store = make_store(aws.dynamodb, aws)
    old = message("r-1", NOW_MS)  # released at its due second
    release_s = old.release_at_ms // 1000
    first = reschedule(NOW_MS + 1_000)
    store.put_reschedules([(first, release_s, deadline())], NOW_MS + 1_000)
    # The emitter finds the announcement, seals the second, then reads the marker.
    assert store.cancelled([old], NOW_MS + 2_000, deadline()) == [True]
    shard, _ = shard_and_bucket("r-1", aws.settings.shards)
    assert clock_item(aws, shard)["z"] == {"N": str(release_s)}
    # A later reschedule of the same version is refused: written now, it would land after
    # the emitter's read.
    later = reschedule(NOW_MS + 2_000, "t-2-9")
    assert store.put_reschedules([(later, release_s, deadline())], NOW_MS + 3_000) == [
        RescheduleWrite.SEALED
    ]
    assert store.markers(["r-1"], deadline())["r-1"].moved == (first.ts_ms, first.src)
    # A version released after the sealed second can still be moved.
    assert store.put_reschedules([(later, release_s + 1, deadline())], NOW_MS + 3_000) == [
        RescheduleWrite.RECORDED
    ]
    # A seal never goes back.
    store.seal({shard: release_s - 10}, NOW_MS, deadline())
    assert clock_item(aws, shard)["z"] == {"N": str(release_s)}


def test_the_emitter_reads_markers_only_under_a_seal_of_its_stored_messages_seconds(
    aws: AwsResources,
) -> None:
    calls = ClientProxy(
        aws.dynamodb,
        update_item=aws.dynamodb.update_item,
        batch_get_item=aws.dynamodb.batch_get_item,
    )
    store = make_store(calls, aws)
    store.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    stored = [message(f"s-{n}", NOW_MS, n) for n in range(40)]
    queued = [replace(m, delay_id=f"q-{m.delay_id}", movable=False) for m in stored]
    calls.calls.clear()
    # Messages never stored (queued by ingest, or its direct path): no reschedule can move
    # them, so nothing is written.
    assert store.cancelled(queued, NOW_MS, deadline()) == [False] * 40
    assert [name for name, _ in calls.calls] == ["batch_get_item"]
    calls.calls.clear()
    store.cancelled([*stored, *queued], NOW_MS, deadline())
    seals = [kw for name, kw in calls.calls if name == "update_item"]
    shards = {buckets.shard_of(m.delay_id, aws.settings.shards) for m in stored}
    assert {int(kw["Key"]["pk"]["S"].split("#")[1]) for kw in seals} == shards
    assert {kw["ExpressionAttributeNames"]["#b"] for kw in seals} == {"z"}
    release_s = stored[0].release_at_ms // 1000
    assert {kw["ExpressionAttributeValues"][":s"]["N"] for kw in seals} == {str(release_s)}
    # Read, seal, then read the sealed clocks again: a raise landing before the seal is seen.
    assert [name for name, _ in calls.calls] == [
        "batch_get_item",
        *["update_item"] * len(shards),
        "batch_get_item",
    ]
    # The next batch of that second finds the seals there: it writes nothing.
    calls.calls.clear()
    store.cancelled(stored[:5], NOW_MS + 100, deadline())
    assert [name for name, _ in calls.calls] == ["batch_get_item"]


def test_a_control_that_lands_between_the_clock_read_and_the_seal_is_seen(
    aws: AwsResources,
) -> None:
    # The emitter reads the clock (no control yet); a reschedule is raised and its marker
    # lands before the emitter's seal: reading the sealed clock again finds the control, so
    # the old version is dropped (the reschedule's copy goes at the new time only).
    late = LateWrites(aws.dynamodb)
    ingest = make_store(late, aws)
    ingest.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    old = message("r-1", NOW_MS)
    move = reschedule(NOW_MS + 1_000)
    reads: list[int] = []

    def batch_get_item(**kwargs: Any) -> Any:
        answer = aws.dynamodb.batch_get_item(**kwargs)
        reads.append(1)
        if len(reads) == 1:  # right after the emitter's first clock read
            with pytest.raises(DelayQueueError):  # its transaction times out (held)
                ingest.put_reschedules(
                    [(move, old.release_at_ms // 1000, Deadline.after(1))], NOW_MS + 1_000
                )
        return answer

    def update_item(**kwargs: Any) -> Any:
        if kwargs["ExpressionAttributeNames"].get("#b") == "z":
            late.land()  # lands just before the seal
        return aws.dynamodb.update_item(**kwargs)

    emitter = make_store(
        ClientProxy(aws.dynamodb, batch_get_item=batch_get_item, update_item=update_item), aws
    )
    assert emitter.cancelled([old], NOW_MS + 2_000, deadline()) == [True]
