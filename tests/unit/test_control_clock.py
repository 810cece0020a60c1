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
    PENDING_SECONDS,
    ControlClock,
    clock_key,
    shard_and_bucket,
)
from delayq.records import CancelRequest, DelayRequest, RescheduleRequest
from delayq.retry import Deadline
from delayq.store import MessageStore, RescheduleWrite, cancel_key
from testkit.aws import item_size, read_units, write_units
from testkit.clock import NOW_MS, no_sleep_backoff
from tests.factories import AwsResources, ClientProxy, delay_request

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
    # One read of each shard's clock, strongly consistent.
    table = aws.settings.table_name
    ((_, kw),) = proxy.calls
    assert len(kw["RequestItems"][table]["Keys"]) == aws.settings.shards
    assert kw["RequestItems"][table]["ConsistentRead"] is True


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


def test_a_reschedule_announces_itself_until_its_write_can_no_longer_land(
    aws: AwsResources,
) -> None:
    store = make_store(aws.dynamodb, aws)
    shard, _ = shard_and_bucket("r-1", aws.settings.shards)
    store.put_reschedules([(reschedule(NOW_MS), NOW_S + 600, deadline())], NOW_MS)
    assert clock_item(aws, shard)["p"] == {"N": str(NOW_S + PENDING_SECONDS)}
    # 900 s of an invocation, then five minutes during which AWS accepts a signed request.
    assert PENDING_SECONDS >= 900 + 300
    # An earlier announcement never shortens a later one; a cancel announces nothing.
    store.put_reschedules([(reschedule(NOW_MS, "t-2-5"), NOW_S + 600, deadline())], NOW_MS - 5000)
    store.put_cancels([cancel("r-1", NOW_MS)], NOW_MS + 60_000, deadline())
    assert clock_item(aws, shard)["p"] == {"N": str(NOW_S + PENDING_SECONDS)}


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


def test_the_emitter_seals_only_a_shard_with_an_announced_reschedule_it_must_read(
    aws: AwsResources,
) -> None:
    updates = ClientProxy(aws.dynamodb, update_item=aws.dynamodb.update_item)
    store = make_store(updates, aws)
    store.control_clocks(range(aws.settings.shards), LONG_AGO_MS, deadline())
    later = message("r-1", NOW_MS + 60_000)
    store.put_cancels([cancel("r-1", NOW_MS)], NOW_MS, deadline())
    updates.calls.clear()
    # A cancel announces nothing: the emitter reads the marker without sealing.
    assert store.cancelled([message("r-1", NOW_MS - 1_000)], NOW_MS, deadline()) == [True]
    assert updates.calls == []
    store.put_reschedules([(reschedule(NOW_MS), 0, deadline())], NOW_MS)
    updates.calls.clear()
    # A message no control can apply to (written after every control of its bucket): no seal.
    assert store.cancelled([later], NOW_MS + 61_000, deadline()) == [False]
    assert updates.calls == []
    # Once the announcement has expired, no seal either.
    old = message("r-1", NOW_MS - 1_000)
    expired_ms = (NOW_S + PENDING_SECONDS + 1) * 1000
    store.cancelled([old], expired_ms, deadline())
    assert updates.calls == []
    store.cancelled([old], NOW_MS + 1_000, deadline())
    assert [kw["ExpressionAttributeNames"]["#b"] for _, kw in updates.calls] == ["z"]
