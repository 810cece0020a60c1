"""The stored form of a message: compressed key and value, trimmed attributes, every item
version read back exactly (moto, stream images, items written before compression)."""

from __future__ import annotations

import base64
import dataclasses
import json
import zlib
from typing import Any

import pytest

from delayq import buckets
from delayq import constants as c
from delayq.exceptions import StoreError
from delayq.ingest import needs_offload
from delayq.records import DelayRequest, estimated_body_bytes
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import MessageStore, message_item, placement_items, request_from_item
from testkit.aws import item_size, write_units
from testkit.clock import NOW_MS, no_sleep_backoff
from testkit.payload import order_event, random_bytes
from tests.factories import AwsResources, delay_request

DUE_MS = NOW_MS + 3_600_000 + 250
DYNAMODB_MAX_ITEM_BYTES = 400 * 1024


def item(request: DelayRequest) -> dict[str, Any]:
    return message_item(request, 16, 86_400)


def json_message(index: int = 1) -> DelayRequest:
    """The benchmark's 1 KB message: 16 B key, one 16 B header, a 984 B JSON event."""
    return delay_request(
        delay_id=f"delay-requests-0-{index}",
        src=f"delay-requests-0-{index}",
        key=f"key-{index:012d}".encode(),
        value=order_event(index, 984),
        headers=(("trace-id", b"0123456789abcdef"),),
        due_ms=DUE_MS,
    )


def stream_image(stored: dict[str, Any]) -> dict[str, Any]:
    """A low-level item as a DynamoDB stream record shows it (binary as base64 text)."""
    return {
        k: {"B": base64.b64encode(v["B"]).decode()} if "B" in v else v for k, v in stored.items()
    }


# --- size ------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(0, 1024, 97))
def test_a_1_kb_json_message_is_stored_in_one_write_unit(index: int) -> None:
    request = json_message(index)
    assert request.size == 1024
    assert item_size(item(request)) <= 1024
    assert write_units(item_size(item(request))) == 1


def test_a_compressible_value_is_stored_compressed_and_comes_back_exact() -> None:
    request = json_message()
    stored = item(request)
    assert c.ATTR_VALUE not in stored
    assert len(stored[c.ATTR_VALUE_Z]["B"]) < len(request.value or b"")
    assert request_from_item(stored) == request


def test_an_incompressible_value_is_stored_as_it_is() -> None:
    request = dataclasses.replace(json_message(), value=random_bytes(3, 984))
    stored = item(request)
    assert stored[c.ATTR_VALUE] == {"B": request.value}
    assert c.ATTR_VALUE_Z not in stored
    assert request_from_item(stored) == request


def test_a_long_repetitive_key_is_compressed_a_short_one_is_not() -> None:
    long_key = delay_request(key=b"customer-0001/" * 20, value=None)
    short_key = delay_request(key=b"k-1", value=None)
    assert c.ATTR_KEY_Z in item(long_key)
    assert c.ATTR_KEY not in item(long_key)
    assert item(short_key)[c.ATTR_KEY] == {"B": b"k-1"}
    assert request_from_item(item(long_key)) == long_key
    # Under 64 bytes nothing is compressed, even what zlib would shrink a little.
    short_repetitive = delay_request(key=b"a" * 63, value=b"b" * 63)
    assert item(short_repetitive)[c.ATTR_KEY] == {"B": b"a" * 63}
    assert item(short_repetitive)[c.ATTR_VALUE] == {"B": b"b" * 63}
    assert request_from_item(item(short_repetitive)) == short_repetitive


def test_size_counts_the_message_bytes_not_the_stored_ones() -> None:
    request = json_message()
    assert item(request)["size"] == {"N": "1024"}


def test_the_largest_inline_message_fits_a_dynamodb_item() -> None:
    """Ingest offloads a value to S3 when the envelope would not fit SQS; what stays inline,
    with the most key and headers a record may carry, is far below DynamoDB's 400 KB."""
    settings = Settings(offload_threshold_bytes=10 * 1024 * 1024)
    key = random_bytes(1, 30_000)
    headers = (("blob", random_bytes(2, 17_000)),)
    base = delay_request(key=key, headers=headers, value=b"")
    assert estimated_body_bytes(dataclasses.replace(base, value=None)) <= (
        c.MAX_INLINE_KEY_AND_HEADERS_BYTES
    )
    low, high = 0, c.SQS_MAX_MESSAGE_BYTES
    while low < high:  # the largest value ingest keeps inline
        mid = (low + high + 1) // 2
        if needs_offload(dataclasses.replace(base, value=random_bytes(3, mid)), settings):
            high = mid - 1
        else:
            low = mid
    largest = dataclasses.replace(base, value=random_bytes(3, low))
    assert needs_offload(dataclasses.replace(base, value=random_bytes(3, low + 1)), settings)
    assert item_size(item(largest)) < DYNAMODB_MAX_ITEM_BYTES
    assert request_from_item(item(largest)) == largest


# --- trimmed attributes ------------------------------------------------------------------------


def test_src_is_left_out_when_it_is_the_delay_id() -> None:
    same = delay_request(delay_id="delay-requests-0-7", src="delay-requests-0-7")
    assert "src" not in item(same)
    assert request_from_item(item(same)).src == "delay-requests-0-7"


def test_src_is_kept_when_the_producer_chose_the_id() -> None:
    chosen = delay_request(delay_id="order-42", src="delay-requests-0-7")
    assert item(chosen)["src"] == {"S": "delay-requests-0-7"}
    assert request_from_item(item(chosen)) == chosen


def test_no_headers_no_headers_attribute() -> None:
    request = delay_request(headers=())
    assert "headers" not in item(request)
    assert request_from_item(item(request)) == request


def test_the_ingest_time_is_not_stored() -> None:
    assert "ingested_ms" not in item(json_message())


# --- every version, every source -----------------------------------------------------------------


def test_an_item_written_before_compression_reads_back() -> None:
    legacy = {
        "pk": {"S": f"{DUE_MS // 1000}#3"},
        "sk": {"S": "order-1"},
        "kind": {"S": "msg"},
        "due_ms": {"N": str(DUE_MS)},
        "target": {"S": "orders.timeout"},
        "key": {"B": b"k"},
        "value": {"B": b'{"order":1}'},
        "headers": {"S": '[["h","MQ=="],["n",null]]'},
        "src": {"S": "order-1"},
        "size": {"N": "14"},
        "ingested_ms": {"N": str(NOW_MS)},
        "expires_at": {"N": str(DUE_MS // 1000 + 1 + 600)},
    }
    assert request_from_item(legacy) == DelayRequest(
        "order-1", "orders.timeout", DUE_MS, b"k", b'{"order":1}', (("h", b"1"), ("n", None)),
        "order-1",
    )  # fmt: skip


def test_a_stream_image_with_compressed_binaries_reads_back() -> None:
    request = dataclasses.replace(json_message(), key=b"tenant-7/" * 30)
    stored = item(request)
    assert {c.ATTR_KEY_Z, c.ATTR_VALUE_Z} <= stored.keys()
    assert request_from_item(stream_image(stored)) == request


def test_missing_key_and_value_stay_none() -> None:
    request = delay_request(key=None, value=None, headers=())
    stored = item(request)
    assert not {c.ATTR_KEY, c.ATTR_KEY_Z, c.ATTR_VALUE, c.ATTR_VALUE_Z} & stored.keys()
    assert request_from_item(stored) == request
    assert request_from_item(stream_image(stored)) == request


def test_empty_key_and_value_stay_empty() -> None:
    request = delay_request(key=b"", value=b"")
    assert request_from_item(stream_image(item(request))) == request


def test_a_claim_check_item_keeps_its_pointer_and_no_value() -> None:
    request = dataclasses.replace(
        json_message(), value=None, payload_ref="s3://bucket/payloads/abc/1"
    )
    stored = item(request)
    assert stored["payload_ref"] == {"S": "s3://bucket/payloads/abc/1"}
    assert not {c.ATTR_VALUE, c.ATTR_VALUE_Z} & stored.keys()
    assert request_from_item(stored) == request
    assert request_from_item(stream_image(stored)) == request


def test_a_capped_message_waits_in_the_bucket_of_its_release_and_expires_after_it() -> None:
    release_ms = DUE_MS + 7_000
    capped = dataclasses.replace(json_message(1), tenant="bulk", release_ms=release_ms)
    item = message_item(capped, 4, 3600)
    plain = message_item(json_message(1), 4, 3600)
    assert item[c.ATTR_PK]["S"] == buckets.bucket_key(
        buckets.due_second(release_ms), buckets.shard_of(capped.delay_id, 4)
    )
    assert item[c.ATTR_PK]["S"] != plain[c.ATTR_PK]["S"]
    assert int(item[c.ATTR_TTL]["N"]) == int(plain[c.ATTR_TTL]["N"]) + 7
    assert item["due_ms"] == plain["due_ms"]
    # Normal priority, no tenant and no release time cost no attribute.
    assert not {c.ATTR_TENANT, c.ATTR_PRIORITY, c.ATTR_RELEASE_MS} & plain.keys()


def test_every_form_round_trips_through_dynamodb(aws: AwsResources) -> None:
    store = MessageStore(
        aws.dynamodb,
        aws.settings.table_name,
        shards=aws.settings.shards,
        ttl_grace_seconds=aws.settings.ttl_grace_seconds,
        max_delay_seconds=aws.settings.max_delay_seconds,
        backoff=no_sleep_backoff(),
    )
    sent = [
        json_message(1),
        dataclasses.replace(json_message(2), value=random_bytes(3, 984)),
        dataclasses.replace(json_message(3), key=None, value=None, headers=()),
        dataclasses.replace(json_message(4), value=None, payload_ref="s3://b/payloads/x/4"),
        dataclasses.replace(json_message(5), delay_id="order-5", key=b"tenant-7/" * 30),
        dataclasses.replace(
            json_message(6), tenant="acme", priority=c.PRIORITY_HIGH, release_ms=NOW_MS + 9_000
        ),
    ]
    store.put_messages(sent, NOW_MS, Deadline.after(60))
    items = aws.dynamodb.scan(TableName=aws.settings.table_name)["Items"]
    found = sorted((request_from_item(i) for i in items), key=lambda r: r.delay_id)
    assert found == sorted(sent, key=lambda r: r.delay_id)


# --- what is not ours --------------------------------------------------------------------------


def test_a_value_that_is_not_zlib_data_is_a_store_error() -> None:
    stored = {**item(json_message()), c.ATTR_VALUE_Z: {"B": b"not zlib"}}
    with pytest.raises(StoreError, match="value_z is not zlib data"):
        request_from_item(stored)


def test_a_truncated_value_is_a_store_error() -> None:
    packed = zlib.compress(order_event(1, 984))
    stored = {**item(json_message()), c.ATTR_VALUE_Z: {"B": packed[:-8]}}
    with pytest.raises(StoreError, match="truncated or too large"):
        request_from_item(stored)


def test_a_value_inflating_past_any_inline_message_is_refused() -> None:
    bomb = zlib.compress(b"\0" * (c.SQS_MAX_MESSAGE_BYTES + 1), 9)
    stored = {**item(json_message()), c.ATTR_VALUE_Z: {"B": bomb}}
    with pytest.raises(StoreError, match="truncated or too large"):
        request_from_item(stored)


def test_placements_of_a_burst_of_long_ids_stay_far_below_the_item_limit() -> None:
    # 2,000 messages of 1,000-byte ids, one due second, all released later by their cap.
    requests = [
        dataclasses.replace(
            delay_request(delay_id=f"{i:04d}" + "x" * 996, due_ms=DUE_MS, src=f"t-0-{i}"),
            release_ms=DUE_MS + 1000 * (1 + i // 100),
        )
        for i in range(2000)
    ]
    items = placement_items(requests, 86_400)
    assert all(item_size(i) <= c.PLACEMENT_MAX_BYTES + 1024 for i in items)
    assert max(item_size(i) for i in items) < DYNAMODB_MAX_ITEM_BYTES // 4
    pairs = [p for i in items for p in json.loads(i[c.ATTR_PLACEMENTS]["S"])]
    assert len(pairs) == 2000
    # The same batch stored again writes the same items (content-addressed keys).
    assert placement_items(requests, 86_400) == items
    # A message released in its due second has no placement.
    assert placement_items([delay_request(due_ms=DUE_MS)], 86_400) == []
