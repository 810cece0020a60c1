"""The DynamoDB adapter on moto: items, shards, expired items, batches, cancels, watermark."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any, cast

import pytest

from delayq import buckets
from delayq.exceptions import RetriesExhaustedError, StoreError, WatermarkConflictError
from delayq.ordering import Marker, cancel_covers
from delayq.records import CancelRequest, DelayRequest, RescheduleRequest
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import (
    MessageStore,
    RescheduleWrite,
    Watermark,
    cancel_key,
    id_of_sort_key,
    message_item,
    request_from_item,
    sort_key,
)
from testkit.clock import NOW_MS, no_sleep_backoff
from tests.factories import AwsResources, ClientProxy, client_error, delay_request

DUE_MS = NOW_MS + 3_600_000 + 250
DUE_S = DUE_MS // 1000
RELEASE_S = DUE_S  # the release second of the version a reschedule moves
RECORDED, SUPERSEDED = RescheduleWrite.RECORDED, RescheduleWrite.SUPERSEDED


def make_store(client: Any, settings: Settings, **overrides: Any) -> MessageStore:
    options: dict[str, Any] = {
        "shards": settings.shards,
        "ttl_grace_seconds": settings.ttl_grace_seconds,
        "max_delay_seconds": settings.max_delay_seconds,
        "backoff": no_sleep_backoff(),
    }
    options.update(overrides)
    return MessageStore(client, settings.table_name, **options)


@pytest.fixture
def store(aws: AwsResources) -> MessageStore:
    return make_store(aws.dynamodb, aws.settings)


def deadline() -> Deadline:
    return Deadline.after(60)


def all_items(aws: AwsResources) -> list[dict[str, Any]]:
    """Every item but the control clocks (tests/unit/test_control_clock.py)."""
    items: list[dict[str, Any]] = aws.dynamodb.scan(TableName=aws.settings.table_name)["Items"]
    return [i for i in items if not i["pk"]["S"].startswith("clock#")]


def requests(count: int, due_ms: int = DUE_MS) -> list[DelayRequest]:
    return [delay_request(delay_id=f"order-{i}", due_ms=due_ms) for i in range(count)]


def query_one(store: MessageStore, second: int, now_ms: int, shards: int = 4) -> list[DelayRequest]:
    """Every message of one due-second, page after page of every shard."""
    found: list[DelayRequest] = []
    starts: list[tuple[str, str | None]] = [
        (pk, None) for pk in buckets.bucket_keys(second, shards)
    ]
    while starts:
        pages = store.query_pages(starts, 100, now_ms, deadline())
        found += [m for page in pages for m in page.messages]
        starts = [(page.pk, page.last_key) for page in pages if page.last_key is not None]
    return found


def second_of(store: MessageStore) -> int | None:
    """The watermark's second, or None when there is no watermark."""
    mark = store.read_watermark(deadline())
    return None if mark is None else mark.second


def sorted_by_id(found: list[DelayRequest]) -> list[DelayRequest]:
    return sorted(found, key=lambda r: r.delay_id)


# --- messages ----------------------------------------------------------------------------------


def test_a_stored_message_comes_back_unchanged(store: MessageStore) -> None:
    request = delay_request(
        key=b"\x00\xffkey",
        value=b"\x80binary\x00",
        headers=(("trace", b"t-1"), ("empty", None), ("trace", b"t-2"), ("raw", b"\xff")),
        due_ms=DUE_MS,
    )
    store.put_messages([request], NOW_MS, deadline())
    assert query_one(store, DUE_S, NOW_MS) == [request]


def test_missing_key_and_value_come_back_as_none(store: MessageStore) -> None:
    request = delay_request(key=None, value=None, headers=(), due_ms=DUE_MS)
    store.put_messages([request], NOW_MS, deadline())
    assert query_one(store, DUE_S, NOW_MS) == [request]


def test_an_offloaded_message_keeps_its_pointer(store: MessageStore) -> None:
    request = delay_request(value=None, payload_ref="s3://bucket/payloads/abc/1", due_ms=DUE_MS)
    store.put_messages([request], NOW_MS, deadline())
    assert query_one(store, DUE_S, NOW_MS) == [request]


def test_message_item_has_the_documented_layout() -> None:
    request = delay_request(
        delay_id="order-1", key=b"k", value=b"vv", headers=(("h", b"1"),), due_ms=DUE_MS
    )
    item = message_item(request, shards=4, ttl_grace_seconds=600)
    assert item == {
        "pk": {"S": f"{DUE_S}#3"},  # crc32("order-1") % 4 == 3
        # The id, then a tag of the record (its coordinates' 48-bit blake2b, base64url).
        "sk": {"S": "order-1#C3v6WVSN"},
        "kind": {"S": "msg"},
        "due_ms": {"N": str(DUE_MS)},
        "target": {"S": "orders.timeout"},
        "key": {"B": b"k"},
        "value": {"B": b"vv"},
        "headers": {"S": '[["h","MQ=="]]'},
        "src": {"S": "delay-requests-0-0"},
        "size": {"N": "5"},
        "expires_at": {"N": str(DUE_S + 1 + 600)},
    }


def test_request_from_a_stream_image_decodes_base64_binaries() -> None:
    item = message_item(delay_request(key=b"\x00k", value=b"\xffv"), 4, 600)
    image = {
        **item,
        "key": {"B": base64.b64encode(b"\x00k").decode()},
        "value": {"B": base64.b64encode(b"\xffv").decode()},
    }
    assert (request_from_item(image).key, request_from_item(image).value) == (b"\x00k", b"\xffv")


def test_ids_of_one_second_are_spread_over_every_shard(
    store: MessageStore, aws: AwsResources
) -> None:
    store.put_messages(requests(40), NOW_MS, deadline())
    pks = {i["pk"]["S"] for i in all_items(aws)}
    assert pks == {f"{DUE_S}#{s}" for s in range(aws.settings.shards)}
    assert len(query_one(store, DUE_S, NOW_MS)) == 40


def test_query_returns_only_the_asked_second(store: MessageStore) -> None:
    store.put_messages(
        [
            delay_request(delay_id="before", due_ms=DUE_S * 1000 - 1),
            delay_request(delay_id="first-ms", due_ms=DUE_S * 1000),
            delay_request(delay_id="last-ms", due_ms=DUE_S * 1000 + 999),
            delay_request(delay_id="after", due_ms=DUE_S * 1000 + 1000),
        ],
        NOW_MS,
        deadline(),
    )
    found = query_one(store, DUE_S, NOW_MS)
    assert sorted(r.delay_id for r in found) == ["first-ms", "last-ms"]


def test_an_empty_second_queries_to_nothing(store: MessageStore) -> None:
    assert query_one(store, DUE_S, NOW_MS) == []


def test_query_pages_reads_one_page_of_each_partition_in_the_order_asked(
    aws: AwsResources,
) -> None:
    proxy = ClientProxy(aws.dynamodb, query=aws.dynamodb.query)
    store = make_store(proxy, aws.settings)
    store.put_messages(requests(40), NOW_MS, deadline())
    starts: list[tuple[str, str | None]] = [
        (f"{DUE_S}#3", None),
        (f"{DUE_S + 1}#0", None),
        (f"{DUE_S}#0", None),
    ]
    pages = store.query_pages(starts, 2, NOW_MS, deadline())
    assert [p.pk for p in pages] == [f"{DUE_S}#3", f"{DUE_S + 1}#0", f"{DUE_S}#0"]
    assert [len(p.messages) for p in pages] == [2, 0, 2]
    assert pages[1].last_key is None
    assert pages[0].last_key == max(sort_key(r) for r in pages[0].messages)
    assert {kw["Limit"] for _, kw in proxy.calls} == {2}


def test_query_pages_reads_on_after_the_key_given(store: MessageStore) -> None:
    store.put_messages(requests(40), NOW_MS, deadline())
    pk = f"{DUE_S}#0"
    whole = store.query_pages([(pk, None)], 100, NOW_MS, deadline())[0]
    assert whole.last_key is None
    keys = [sort_key(r) for r in whole.messages]
    assert keys == sorted(keys)
    rest = store.query_pages([(pk, keys[1])], 100, NOW_MS, deadline())[0]
    assert [sort_key(r) for r in rest.messages] == keys[2:]


def test_query_pages_of_nothing_asks_nothing(aws: AwsResources) -> None:
    proxy = ClientProxy(aws.dynamodb, query=aws.dynamodb.query)
    assert make_store(proxy, aws.settings).query_pages([], 10, NOW_MS, deadline()) == []
    assert proxy.calls == []


def test_an_expired_item_that_ttl_has_not_deleted_is_still_read(aws: AwsResources) -> None:
    # TTL deletes late ("within a few days"): whatever the scheduler has not passed was never
    # sent, so an expired message is sent late rather than dropped.
    store = make_store(aws.dynamodb, aws.settings.with_overrides(shards=1), ttl_grace_seconds=10)
    store.put_messages([delay_request(delay_id="b-live", due_ms=NOW_MS)], NOW_MS, deadline())
    expired = message_item(delay_request(delay_id="a-expired", due_ms=NOW_MS), 1, -100)
    aws.dynamodb.put_item(TableName=aws.settings.table_name, Item=expired)
    pk = buckets.bucket_key(NOW_MS // 1000, 0)
    first = store.query_pages([(pk, None)], 1, NOW_MS, deadline())[0]
    assert [r.delay_id for r in first.messages] == ["a-expired"]
    assert first.last_key == sort_key(first.messages[0])
    second = store.query_pages([(pk, first.last_key)], 1, NOW_MS, deadline())[0]
    assert [r.delay_id for r in second.messages] == ["b-live"]


@pytest.mark.parametrize("after_expiry_ms", [-1, 0, 5000, 3 * 86_400_000])
def test_a_query_ignores_expiry(aws: AwsResources, after_expiry_ms: int) -> None:
    store = make_store(aws.dynamodb, aws.settings, ttl_grace_seconds=10)
    store.put_messages([delay_request(due_ms=NOW_MS)], NOW_MS, deadline())
    expires_ms = (NOW_MS // 1000 + 10) * 1000
    assert len(query_one(store, NOW_MS // 1000, expires_ms + after_expiry_ms)) == 1


def test_queries_are_strongly_consistent(aws: AwsResources) -> None:
    # The ingest guard rests on it: a write completed before the Query is in its answer.
    proxy = ClientProxy(aws.dynamodb, query=aws.dynamodb.query)
    make_store(proxy, aws.settings).query_pages(
        [("1#0", None), ("1#1", "x")], 5, NOW_MS, deadline()
    )
    assert [kw["ConsistentRead"] for _, kw in proxy.calls] == [True, True]


def test_query_one_follows_every_page(aws: AwsResources) -> None:
    def query(**kwargs: Any) -> Any:
        return aws.dynamodb.query(**{**kwargs, "Limit": 1})

    proxy = ClientProxy(aws.dynamodb, query=query)
    store = make_store(proxy, aws.settings.with_overrides(shards=1))
    store.put_messages(requests(3), NOW_MS, deadline())
    assert len(query_one(store, DUE_S, NOW_MS, shards=1)) == 3
    assert len(proxy.calls) >= 3


def strict_batch_writes(aws: AwsResources) -> ClientProxy:
    """moto accepts one key twice in a BatchWriteItem; DynamoDB refuses the whole call."""
    table = aws.settings.table_name

    def batch_write_item(**kwargs: Any) -> Any:
        keys = [
            (p["PutRequest"]["Item"]["pk"]["S"], p["PutRequest"]["Item"]["sk"]["S"])
            for p in kwargs["RequestItems"][table]
        ]
        if len(set(keys)) != len(keys):
            raise client_error("ValidationException")
        return aws.dynamodb.batch_write_item(**kwargs)

    return ClientProxy(aws.dynamodb, batch_write_item=batch_write_item)


def test_one_id_twice_in_a_batch_is_one_item_the_last_write_wins(aws: AwsResources) -> None:
    store = make_store(strict_batch_writes(aws), aws.settings)
    first = delay_request(delay_id="dup", value=b"first", due_ms=DUE_MS)
    last = delay_request(delay_id="dup", value=b"last", due_ms=DUE_MS)
    store.put_messages([first, last], NOW_MS, deadline())
    assert query_one(store, DUE_S, NOW_MS) == [last]
    assert len(all_items(aws)) == 1


def test_one_cancel_twice_in_a_batch_is_one_marker_the_latest(aws: AwsResources) -> None:
    store = make_store(aws.dynamodb, aws.settings)
    store.put_cancels([cancel("order-1", 10), cancel("order-1", 20)], NOW_MS, deadline())
    assert store.markers(["order-1"], deadline()) == {
        "order-1": Marker(cancel=(NOW_MS + 20, "delay-requests-0-20"))
    }
    assert len(all_items(aws)) == 1


def test_one_id_with_two_due_seconds_is_two_items(store: MessageStore, aws: AwsResources) -> None:
    store.put_messages(
        [
            delay_request(delay_id="dup", due_ms=DUE_MS),
            delay_request(delay_id="dup", due_ms=DUE_MS + 1000),
        ],
        NOW_MS,
        deadline(),
    )
    assert len(all_items(aws)) == 2


def test_more_than_25_items_are_written_in_batches_of_25(aws: AwsResources) -> None:
    proxy = ClientProxy(aws.dynamodb, batch_write_item=aws.dynamodb.batch_write_item)
    store = make_store(proxy, aws.settings)
    store.put_messages(requests(60), NOW_MS, deadline())
    sizes = [len(kw["RequestItems"][aws.settings.table_name]) for _, kw in proxy.calls]
    assert sizes == [25, 25, 10]
    assert len(query_one(store, DUE_S, NOW_MS)) == 60


def test_unprocessed_items_are_written_again_and_only_those(aws: AwsResources) -> None:
    table = aws.settings.table_name

    def batch_write_item(**kwargs: Any) -> Any:
        puts = kwargs["RequestItems"][table]
        if len(proxy.calls) == 1:
            aws.dynamodb.batch_write_item(RequestItems={table: puts[:-3]})
            return {"UnprocessedItems": {table: puts[-3:]}}
        return aws.dynamodb.batch_write_item(**kwargs)

    proxy = ClientProxy(aws.dynamodb, batch_write_item=batch_write_item)
    store = make_store(proxy, aws.settings)
    store.put_messages(requests(10), NOW_MS, deadline())
    first, second = (kw["RequestItems"][table] for _, kw in proxy.calls)
    assert second == first[-3:]
    assert sorted_by_id(query_one(store, DUE_S, NOW_MS)) == sorted_by_id(requests(10))


def test_items_never_processed_raise_with_the_unsent_items(aws: AwsResources) -> None:
    table = aws.settings.table_name

    def batch_write_item(**kwargs: Any) -> Any:
        return {"UnprocessedItems": {table: kwargs["RequestItems"][table]}}

    proxy = ClientProxy(aws.dynamodb, batch_write_item=batch_write_item)
    store = make_store(proxy, aws.settings, backoff=no_sleep_backoff(3))
    with pytest.raises(RetriesExhaustedError) as caught:
        store.put_messages(requests(2), NOW_MS, deadline())
    assert len(proxy.calls) == 3
    unsent = cast("list[dict[str, Any]]", caught.value.unsent)
    assert sorted(id_of_sort_key(i) for i in unsent) == ["order-0", "order-1"]


def test_a_throttled_batch_is_written_again(aws: AwsResources) -> None:
    def batch_write_item(**kwargs: Any) -> Any:
        if len(proxy.calls) == 1:
            raise client_error("ProvisionedThroughputExceededException")
        return aws.dynamodb.batch_write_item(**kwargs)

    proxy = ClientProxy(aws.dynamodb, batch_write_item=batch_write_item)
    make_store(proxy, aws.settings).put_messages(requests(2), NOW_MS, deadline())
    assert len(all_items(aws)) == 2
    assert len(proxy.calls) == 2


# --- non-retryable errors ----------------------------------------------------------------------


@pytest.fixture
def missing_table(aws: AwsResources) -> MessageStore:
    return make_store(aws.dynamodb, aws.settings.with_overrides(table_name="no-such-table"))


def test_put_messages_to_a_missing_table_is_a_store_error(missing_table: MessageStore) -> None:
    with pytest.raises(StoreError, match="BatchWriteItem failed") as caught:
        missing_table.put_messages(requests(1), NOW_MS, deadline())
    assert caught.value.__cause__.response["Error"]["Code"] == "ResourceNotFoundException"  # type: ignore[union-attr]


def test_query_of_a_missing_table_is_a_store_error(missing_table: MessageStore) -> None:
    with pytest.raises(StoreError, match="query due-second"):
        query_one(missing_table, DUE_S, NOW_MS)


def test_reading_cancels_of_a_missing_table_is_a_store_error(missing_table: MessageStore) -> None:
    with pytest.raises(StoreError, match="read control clocks"):
        missing_table.cancelled([delay_request()], NOW_MS, deadline())


def test_reading_the_watermark_of_a_missing_table_is_a_store_error(
    missing_table: MessageStore,
) -> None:
    with pytest.raises(StoreError, match="read watermark"):
        second_of(missing_table)


def test_advancing_the_watermark_of_a_missing_table_is_not_a_conflict(
    missing_table: MessageStore,
) -> None:
    with pytest.raises(StoreError) as caught:
        missing_table.create_watermark(DUE_S, NOW_MS, deadline())
    assert not isinstance(caught.value, WatermarkConflictError)


def test_put_item_to_a_missing_table_is_a_store_error(missing_table: MessageStore) -> None:
    with pytest.raises(StoreError, match="put item"):
        missing_table.put_item({"pk": {"S": "stats#1"}, "sk": {"S": "x"}}, deadline())


def test_put_item_writes_one_item(store: MessageStore, aws: AwsResources) -> None:
    store.put_item({"pk": {"S": "stats#1"}, "sk": {"S": "inv-1"}, "n": {"N": "3"}}, deadline())
    assert all_items(aws) == [{"pk": {"S": "stats#1"}, "sk": {"S": "inv-1"}, "n": {"N": "3"}}]


# --- cancel markers ----------------------------------------------------------------------------


def cancel(delay_id: str, offset: int, *, ts_ms: int | None = None) -> CancelRequest:
    """A cancel record at ``offset`` of partition 0, written at ``NOW_MS + offset``."""
    return CancelRequest(
        delay_id, f"delay-requests-0-{offset}", NOW_MS + offset if ts_ms is None else ts_ms
    )


def message(delay_id: str, offset: int, *, ts_ms: int | None = None) -> DelayRequest:
    """A message record at ``offset`` of partition 0, written at ``NOW_MS + offset``."""
    return replace(
        delay_request(delay_id=delay_id, src=f"delay-requests-0-{offset}"),
        ts_ms=NOW_MS + offset if ts_ms is None else ts_ms,
    )


def test_cancel_marker_has_the_documented_layout(store: MessageStore, aws: AwsResources) -> None:
    store.put_cancels([cancel("order-1", 7)], NOW_MS, deadline())
    s = aws.settings
    assert all_items(aws) == [
        {
            "pk": {"S": "cancel#3"},  # crc32("order-1") % 4 == 3
            "sk": {"S": "order-1"},
            "kind": {"S": "cancel"},
            # Sorts as the record order: timestamp, topic, partition + 1, offset + 1.
            "cancel_order": {
                "S": f"{NOW_MS + 7:016d}|delay-requests|0000000001|00000000000000000008"
            },
            "cancel_ts": {"N": str(NOW_MS + 7)},
            "cancel_src": {"S": "delay-requests-0-7"},
            "cancelled_ms": {"N": str(NOW_MS)},
            # Outlives every message it covers: the longest delay, 7 days of release spread,
            # then a day of grace, 7 of TTL lag, a day of target outage, 14 in a dead-letter
            # queue and a day of margin.
            "expires_at": {"N": str(NOW_MS // 1000 + s.max_delay_seconds + 31 * 86400)},
        }
    ]


def test_cancel_key_shards_by_id() -> None:
    assert cancel_key("order-2", 16) == {"pk": {"S": "cancel#5"}, "sk": {"S": "order-2"}}


def test_cancelled_finds_exactly_the_marked_ids_over_many_batches(aws: AwsResources) -> None:
    proxy = ClientProxy(aws.dynamodb, batch_get_item=aws.dynamodb.batch_get_item)
    store = make_store(proxy, aws.settings)
    store.put_cancels([cancel(f"order-{i}", 1000) for i in range(0, 250, 2)], NOW_MS, deadline())
    asked = [message(f"order-{i}", 1) for i in range(250)] + [message("order-0", 2)]
    flags = store.cancelled(asked, NOW_MS, deadline())
    assert [r.delay_id for r, f in zip(asked, flags, strict=True) if f] == [
        *(f"order-{i}" for i in range(0, 250, 2)),
        "order-0",
    ]
    table = aws.settings.table_name
    # The clocks of the four shards (created after the messages were written: every marker
    # is read), read again once sealed, then the markers.
    assert [len(kw["RequestItems"][table]["Keys"]) for _, kw in proxy.calls] == [
        4,
        4,
        100,
        100,
        50,
    ]
    # Strongly consistent: a cancel whose write completed before the read is seen.
    assert all(kw["RequestItems"][table]["ConsistentRead"] for _, kw in proxy.calls)


def test_cancelled_of_no_requests_asks_nothing(aws: AwsResources) -> None:
    proxy = ClientProxy(aws.dynamodb, batch_get_item=aws.dynamodb.batch_get_item)
    assert make_store(proxy, aws.settings).cancelled([], NOW_MS, deadline()) == []
    assert proxy.calls == []


def test_unprocessed_cancel_keys_are_read_again(aws: AwsResources) -> None:
    table = aws.settings.table_name

    def batch_get_item(**kwargs: Any) -> Any:
        request = kwargs["RequestItems"][table]
        if len(proxy.calls) == 3:  # the markers, after the clocks (read, sealed, read again)
            response = aws.dynamodb.batch_get_item(
                RequestItems={table: {**request, "Keys": request["Keys"][:1]}}
            )
            response["UnprocessedKeys"] = {table: {**request, "Keys": request["Keys"][1:]}}
            return response
        return aws.dynamodb.batch_get_item(**kwargs)

    proxy = ClientProxy(aws.dynamodb, batch_get_item=batch_get_item)
    store = make_store(proxy, aws.settings)
    store.put_cancels([cancel(i, 9) for i in "abc"], NOW_MS, deadline())
    assert store.cancelled([message(i, 1) for i in "abcd"], NOW_MS, deadline()) == [
        True,
        True,
        True,
        False,
    ]
    # The clocks of shards 0, 1 and 3 (twice), then the markers, then those left unprocessed.
    assert [len(kw["RequestItems"][table]["Keys"]) for _, kw in proxy.calls] == [3, 3, 4, 3]


def test_a_cancel_does_not_apply_to_a_later_message_with_its_id(store: MessageStore) -> None:
    # Send r-1, cancel r-1, send r-1 again: the second r-1 is a new message.
    store.put_cancels([cancel("r-1", 5)], NOW_MS, deadline())
    assert store.cancelled([message("r-1", 1), message("r-1", 9)], NOW_MS, deadline()) == [
        True,
        False,
    ]


def test_an_older_cancel_processed_later_does_not_replace_a_newer_one(store: MessageStore) -> None:
    # Cancels from two partitions may be ingested out of order: the marker keeps the latest.
    store.put_cancels([cancel("r-1", 50)], NOW_MS, deadline())
    store.put_cancels([cancel("r-1", 10)], NOW_MS + 1, deadline())
    assert store.markers(["r-1"], deadline()) == {
        "r-1": Marker(cancel=(NOW_MS + 50, "delay-requests-0-50"))
    }
    assert store.cancelled([message("r-1", 30)], NOW_MS, deadline()) == [True]


def test_a_marker_written_before_cancels_had_times_cancels_every_message(
    store: MessageStore, aws: AwsResources
) -> None:
    aws.dynamodb.put_item(
        TableName=aws.settings.table_name,
        Item={**cancel_key("old", aws.settings.shards), "kind": {"S": "cancel"}},
    )
    assert store.cancelled([message("old", 10**6)], NOW_MS, deadline()) == [True]


@pytest.mark.parametrize(
    ("message_ts", "message_src", "covered"),
    [
        (NOW_MS - 1, "t-0-99", True),  # written earlier: covered, whatever its offset
        (NOW_MS + 1, "t-0-1", False),  # written later: a new message
        (NOW_MS, "t-0-4", True),  # same millisecond, same partition, before the cancel
        (NOW_MS, "t-0-6", False),  # same millisecond, same partition, after the cancel
        (NOW_MS, "t-1-6", True),  # same millisecond, another partition: the cancel wins
        (NOW_MS, "custom-id", True),  # no coordinates to compare: the cancel wins
        (0, "t-0-99", True),  # queued before times travelled: covered
    ],
)
def test_which_messages_a_cancel_covers(message_ts: int, message_src: str, covered: bool) -> None:
    request = replace(delay_request(src=message_src), ts_ms=message_ts)
    assert cancel_covers(NOW_MS, "t-0-5", request) is covered


# --- the watermark -----------------------------------------------------------------------------


def test_there_is_no_watermark_before_the_first_run(store: MessageStore) -> None:
    assert second_of(store) is None


def test_the_watermark_advances_from_none_then_from_its_value(store: MessageStore) -> None:
    store.create_watermark(DUE_S, NOW_MS, deadline())
    store.write_watermark(Watermark(DUE_S), Watermark(DUE_S + 60), NOW_MS + 1, deadline())
    assert second_of(store) == DUE_S + 60


def test_the_watermark_item_records_when_it_moved(store: MessageStore, aws: AwsResources) -> None:
    written = store.create_watermark(DUE_S, NOW_MS, deadline())
    assert written.token is not None
    assert all_items(aws) == [
        {
            "pk": {"S": "meta#watermark"},
            "sk": {"S": "-"},
            "kind": {"S": "watermark"},
            "second": {"N": str(DUE_S)},
            "cursors": {"M": {}},
            "token": {"S": written.token},
            "updated_ms": {"N": str(NOW_MS)},
            "reading": {"N": str(DUE_S)},
            "late": {"S": ""},
        }
    ]


def test_progress_inside_a_second_is_written_and_read_back(store: MessageStore) -> None:
    start = store.create_watermark(DUE_S - 1, NOW_MS, deadline())
    cursors = {f"{DUE_S}#0": "order-7", f"{DUE_S}#3": "order-9"}
    written = store.write_watermark(start, Watermark(DUE_S - 1, cursors), NOW_MS, deadline())
    assert written.token not in (None, start.token)
    assert (
        store.read_watermark(deadline())
        == written
        == Watermark(DUE_S - 1, cursors, written.token, DUE_S - 1)
    )


def test_moving_past_a_second_clears_its_progress(store: MessageStore) -> None:
    start = store.create_watermark(DUE_S - 1, NOW_MS, deadline())
    inside = store.write_watermark(
        start, Watermark(DUE_S - 1, {f"{DUE_S}#0": "order-7"}), NOW_MS, deadline()
    )
    store.write_watermark(inside, Watermark(DUE_S), NOW_MS, deadline())
    found = store.read_watermark(deadline())
    assert found is not None
    assert (found.second, found.cursors) == (DUE_S, {})


def test_progress_from_a_stale_token_is_a_conflict(store: MessageStore) -> None:
    start = store.create_watermark(DUE_S - 1, NOW_MS, deadline())
    theirs = store.write_watermark(
        start, Watermark(DUE_S - 1, {f"{DUE_S}#0": "order-7"}), NOW_MS, deadline()
    )
    with pytest.raises(WatermarkConflictError, match="another writer"):
        store.write_watermark(
            start, Watermark(DUE_S - 1, {f"{DUE_S}#0": "order-3"}), NOW_MS, deadline()
        )
    assert store.read_watermark(deadline()) == theirs


def test_moving_past_seconds_needs_only_the_second_it_read(store: MessageStore) -> None:
    """Whoever moves past a second sent all of it from the progress it read: cursors that
    another run recorded since mark messages it sent too."""
    start = store.create_watermark(DUE_S - 1, NOW_MS, deadline())
    store.write_watermark(
        start, Watermark(DUE_S - 1, {f"{DUE_S}#0": "order-7"}), NOW_MS, deadline()
    )
    store.write_watermark(start, Watermark(DUE_S), NOW_MS, deadline())
    assert second_of(store) == DUE_S


def test_cursors_of_another_second_mean_no_progress(store: MessageStore, aws: AwsResources) -> None:
    """An older scheduler moved the second without clearing the cursors (and wrote no token)."""
    aws.dynamodb.put_item(
        TableName=aws.settings.table_name,
        Item={
            "pk": {"S": "meta#watermark"},
            "sk": {"S": "-"},
            "kind": {"S": "watermark"},
            "second": {"N": str(DUE_S + 5)},
            "cursors": {"M": {f"{DUE_S}#0": {"S": "order-7"}}},
        },
    )
    assert store.read_watermark(deadline()) == Watermark(DUE_S + 5, {}, None)


def test_an_item_without_a_token_is_written_by_its_second(
    store: MessageStore, aws: AwsResources
) -> None:
    """As an older scheduler left it: no cursors, no token."""
    aws.dynamodb.put_item(
        TableName=aws.settings.table_name,
        Item={
            "pk": {"S": "meta#watermark"},
            "sk": {"S": "-"},
            "kind": {"S": "watermark"},
            "second": {"N": str(DUE_S)},
        },
    )
    legacy = store.read_watermark(deadline())
    assert legacy == Watermark(DUE_S, {}, None)
    with pytest.raises(WatermarkConflictError):
        store.write_watermark(Watermark(DUE_S - 1), Watermark(DUE_S - 1, {}), NOW_MS, deadline())
    written = store.write_watermark(
        legacy, Watermark(DUE_S, {f"{DUE_S + 1}#2": "order-1"}), NOW_MS, deadline()
    )
    assert store.read_watermark(deadline()) == written


def test_advancing_from_a_stale_value_is_a_conflict(store: MessageStore) -> None:
    store.create_watermark(DUE_S, NOW_MS, deadline())
    store.write_watermark(Watermark(DUE_S), Watermark(DUE_S + 10), NOW_MS, deadline())
    with pytest.raises(WatermarkConflictError, match=f"no longer {DUE_S} as read"):
        store.write_watermark(Watermark(DUE_S), Watermark(DUE_S + 5), NOW_MS, deadline())
    assert second_of(store) == DUE_S + 10


def test_a_second_first_run_is_a_conflict(store: MessageStore) -> None:
    store.create_watermark(DUE_S, NOW_MS, deadline())
    with pytest.raises(WatermarkConflictError):
        store.create_watermark(DUE_S + 1, NOW_MS, deadline())
    assert second_of(store) == DUE_S


def test_a_throttled_watermark_read_is_retried(aws: AwsResources) -> None:
    def get_item(**kwargs: Any) -> Any:
        if len(proxy.calls) == 1:
            raise client_error("ThrottlingException")
        return aws.dynamodb.get_item(**kwargs)

    proxy = ClientProxy(aws.dynamodb, get_item=get_item)
    store = make_store(proxy, aws.settings)
    store.create_watermark(DUE_S, NOW_MS, deadline())
    assert second_of(store) == DUE_S
    assert len(proxy.calls) == 2


def test_shard_count_decides_the_partition_of_a_message() -> None:
    item = message_item(delay_request(delay_id="order-2", due_ms=DUE_MS), 16, 0)
    assert item["pk"]["S"] == buckets.bucket_key(DUE_S, 5)


def test_the_window_a_run_reads_is_kept_until_a_run_records_another(store: MessageStore) -> None:
    start = store.create_watermark(DUE_S, NOW_MS, deadline())
    announced = store.write_watermark(
        start, Watermark(DUE_S, reading=DUE_S + 50), NOW_MS, deadline()
    )
    store.write_watermark(announced, Watermark(DUE_S + 20), NOW_MS, deadline())
    found = store.read_watermark(deadline())
    assert found is not None
    assert (found.second, found.reading, found.guarded_through) == (
        DUE_S + 20,
        DUE_S + 50,
        DUE_S + 50,
    )


def test_late_ranges_are_written_and_read_back(store: MessageStore) -> None:
    start = store.create_watermark(DUE_S, NOW_MS, deadline())
    late = ((DUE_S - 100, DUE_S - 50), (DUE_S + 1, DUE_S + 9))
    store.write_watermark(start, Watermark(DUE_S + 9, late=late), NOW_MS, deadline())
    found = store.read_watermark(deadline())
    assert found is not None
    assert found.late == late
    assert [
        found.scheduled(s) for s in (DUE_S - 101, DUE_S - 70, DUE_S, DUE_S + 5, DUE_S + 10)
    ] == [
        True,
        False,
        True,
        False,
        False,
    ]


def test_an_older_item_guards_what_its_cursors_say() -> None:
    # Written before runs recorded their window: the second in progress is guarded.
    assert Watermark(10).guarded_through == 10
    assert Watermark(10, {"11#0": "x"}).guarded_through == 11
    assert Watermark(10, reading=30).guarded_through == 30


def dynamodb_item_bytes(item: dict[str, Any]) -> int:
    """DynamoDB's item size: attribute names plus values (strings as UTF-8, maps nested)."""

    def value_bytes(value: dict[str, Any]) -> int:
        ((kind, raw),) = value.items()
        if kind == "M":
            return 3 + sum(len(k.encode()) + 1 + value_bytes(v) for k, v in raw.items())
        if kind == "N":
            return len(raw.lstrip("-").replace(".", "")) // 2 + 2
        return len(raw.encode())

    return sum(len(name.encode()) + value_bytes(v) for name, v in item.items())


def test_the_progress_item_fits_dynamodb_with_every_shard_at_the_longest_id(
    aws: AwsResources,
) -> None:
    shards = 256  # the maximum the settings accept
    store = make_store(aws.dynamodb, aws.settings.with_overrides(shards=shards))
    start = store.create_watermark(DUE_S, NOW_MS, deadline())
    longest = "\U0001f600" * 256  # 1,024 bytes of UTF-8: the longest id
    cursors = {f"{DUE_S + 1}#{shard}": longest for shard in range(shards)}
    late = tuple((DUE_S - 1000 * i - 10, DUE_S - 1000 * i) for i in range(64, 0, -1))
    written = store.write_watermark(
        start, Watermark(DUE_S, cursors, reading=DUE_S + 840, late=late), NOW_MS, deadline()
    )
    item = aws.dynamodb.get_item(
        TableName=aws.settings.table_name, Key={"pk": {"S": "meta#watermark"}, "sk": {"S": "-"}}
    )["Item"]
    assert dynamodb_item_bytes(item) < 400 * 1024
    assert store.read_watermark(deadline()) == written


# --- reschedules -----------------------------------------------------------------------------


def reschedule_of(delay_id: str, offset: int, due_ms: int = DUE_MS + 60_000) -> RescheduleRequest:
    """A reschedule record at ``offset`` of partition 0, written at ``NOW_MS + offset``."""
    return RescheduleRequest(
        delay_id, DUE_MS, due_ms, f"delay-requests-0-{offset}", NOW_MS + offset
    )


def moved(request: DelayRequest, by: RescheduleRequest) -> DelayRequest:
    return replace(request, due_ms=by.due_ms, moved_ts_ms=by.ts_ms, moved_src=by.src)


def test_a_reschedule_supersedes_earlier_versions_but_not_its_copy_or_later_messages() -> None:
    r = reschedule_of("r-1", 20)
    marker = Marker(moved=(r.ts_ms, r.src))
    original = message("r-1", 10)
    assert marker.applies(original)
    assert not marker.applies(moved(original, r))
    assert not marker.applies(message("r-1", 30))  # a later message reusing the id
    assert marker.applies(moved(original, reschedule_of("r-1", 15)))  # an older copy


def test_a_cancel_of_the_original_also_cancels_its_copy() -> None:
    r = reschedule_of("r-1", 20)
    copy = moved(message("r-1", 10), r)
    # The cancel was written before the reschedule: it still covers the copy of what it
    # cancelled, whichever of the two ingest processed first.
    assert Marker(cancel=(NOW_MS + 15, "delay-requests-0-15"), moved=(r.ts_ms, r.src)).applies(copy)
    # A cancel before the original was written does not.
    assert not Marker(cancel=(NOW_MS + 5, "delay-requests-0-5")).applies(copy)


def test_a_marker_holding_only_a_reschedule_cancels_nothing(store: MessageStore) -> None:
    r = reschedule_of("r-1", 20)
    assert store.put_reschedules([(r, RELEASE_S, deadline())], NOW_MS) == [RECORDED]
    markers = store.markers(["r-1"], deadline())
    assert markers == {"r-1": Marker(moved=(r.ts_ms, r.src), moved_due_ms=r.due_ms)}
    assert store.cancelled(
        [moved(message("r-1", 10), r), message("r-1", 30)], NOW_MS, deadline()
    ) == [
        False,
        False,
    ]


def test_a_reschedule_and_a_cancel_share_one_marker_item(
    store: MessageStore, aws: AwsResources
) -> None:
    store.put_cancels([cancel("r-1", 5)], NOW_MS, deadline())
    store.put_reschedules([(reschedule_of("r-1", 20), RELEASE_S, deadline())], NOW_MS)
    assert len(all_items(aws)) == 1
    marker = store.markers(["r-1"], deadline())["r-1"]
    assert marker.cancel == (NOW_MS + 5, "delay-requests-0-5")
    assert marker.moved == (NOW_MS + 20, "delay-requests-0-20")


def test_an_older_reschedule_processed_later_loses(store: MessageStore) -> None:
    newer, older = reschedule_of("r-1", 50), reschedule_of("r-1", 10)
    assert store.put_reschedules([(newer, RELEASE_S, deadline())], NOW_MS) == [RECORDED]
    assert store.put_reschedules([(older, RELEASE_S, deadline())], NOW_MS + 1) == [SUPERSEDED]
    assert store.markers(["r-1"], deadline())["r-1"].moved == (newer.ts_ms, newer.src)
    # The same record again (a redelivered batch) is recorded again.
    assert store.put_reschedules([(newer, RELEASE_S, deadline())], NOW_MS + 2) == [RECORDED]


def test_a_reschedule_is_not_written_after_its_deadline(store: MessageStore) -> None:
    with pytest.raises(StoreError, match="not recorded before its cutoff"):
        store.put_reschedules(
            [(reschedule_of("r-1", 20), RELEASE_S, Deadline(lambda: 0, 0))], NOW_MS
        )
    assert store.markers(["r-1"], deadline()) == {}


def test_versions_at_finds_stored_messages_by_id_and_time(store: MessageStore) -> None:
    stored = delay_request(delay_id="r-1", due_ms=DUE_MS)
    other_id = delay_request(delay_id="r-10", due_ms=DUE_MS, src="delay-requests-0-9")
    store.put_messages([stored, other_id], NOW_MS, deadline())
    within = DUE_MS + 999 - DUE_MS % 1000
    found = store.versions_at(
        [("r-1", DUE_MS), ("r-1", within), ("r-1", DUE_MS + 5000)], deadline()
    )
    # Any time within the stored second finds it (the key is the second); "r-10" shares the
    # prefix "r-1" and is not a version of it.
    assert found == {
        ("r-1", DUE_MS): [stored],
        ("r-1", within): [stored],
        ("r-1", DUE_MS + 5000): [],
    }


def test_two_records_of_one_id_in_one_second_are_two_items(store: MessageStore) -> None:
    older = delay_request(delay_id="r-1", due_ms=DUE_MS, src="delay-requests-0-5", value=b"old")
    newer = delay_request(delay_id="r-1", due_ms=DUE_MS, src="delay-requests-1-2", value=b"new")
    # Newer first: ingest order must not decide which one the table keeps.
    store.put_messages([newer], NOW_MS, deadline())
    store.put_messages([older], NOW_MS, deadline())
    found = store.versions_at([("r-1", DUE_MS)], deadline())[("r-1", DUE_MS)]
    assert sorted(r.value or b"" for r in found) == [b"new", b"old"]


def test_the_same_record_stored_twice_is_one_item(store: MessageStore) -> None:
    request = delay_request(delay_id="r-1", due_ms=DUE_MS, src="delay-requests-0-5")
    store.put_messages([request], NOW_MS, deadline())
    store.put_messages([request, request], NOW_MS, deadline())
    assert store.versions_at([("r-1", DUE_MS)], deadline())[("r-1", DUE_MS)] == [request]


def test_a_copy_and_a_new_message_reusing_the_id_in_its_second_are_two_items(
    store: MessageStore,
) -> None:
    copy = moved(message("r-1", 10), reschedule_of("r-1", 20))
    reuse = replace(message("r-1", 30), due_ms=copy.due_ms, src="delay-requests-1-30")
    store.put_messages([copy, reuse], NOW_MS, deadline())
    found = store.versions_at([("r-1", copy.due_ms)], deadline())[("r-1", copy.due_ms)]
    assert sorted(found, key=lambda r: r.src) == sorted([copy, reuse], key=lambda r: r.src)


def test_a_moved_copy_round_trips_through_its_item() -> None:
    copy = moved(message("r-1", 10), reschedule_of("r-1", 20))
    item = message_item(copy, shards=4, ttl_grace_seconds=60)
    assert item["mts"] == {"N": str(NOW_MS + 20)}
    assert request_from_item(item) == copy
