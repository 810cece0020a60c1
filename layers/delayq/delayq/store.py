"""DynamoDB adapter: stored messages, cancel markers, the scheduler watermark, stats items.

One table, low-level client (typed attribute values), every batch call retried item by item.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from botocore.exceptions import ClientError

from delayq import buckets, control_clock
from delayq import constants as c
from delayq.envelope import headers_from_json, headers_json
from delayq.exceptions import StoreError, WatermarkConflictError
from delayq.ordering import Marker, order_token, record_order
from delayq.records import CancelRequest, DelayRequest, RescheduleRequest
from delayq.retry import (
    AWS_ERRORS,
    Backoff,
    Deadline,
    cancellation_codes,
    is_retryable,
    retry_call,
    retry_partial,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import KeysAndAttributesTypeDef

__all__ = [
    "Item",
    "LateRanges",
    "Located",
    "MessageStore",
    "Page",
    "RescheduleWrite",
    "Watermark",
    "cancel_key",
    "condition_failed",
    "id_of_sort_key",
    "locator_item",
    "message_item",
    "message_key",
    "placed_away",
    "placement_items",
    "placement_key",
    "query_pool",
    "request_from_item",
    "sort_key",
]

Item = dict[str, Any]
T = TypeVar("T")


_WATERMARK_KEY: Item = {c.ATTR_PK: {"S": c.WATERMARK_PK}, c.ATTR_SK: {"S": c.WATERMARK_SK}}


class RescheduleWrite(enum.Enum):
    """What writing a reschedule's marker did."""

    RECORDED = "recorded"
    # A later reschedule of the id is recorded already: that one wins.
    SUPERSEDED = "superseded"
    # The old release second was sealed first (by an emitter about to read its markers, or
    # a retried batch refusing a reschedule: ``control_clock``): it goes at its old time.
    SEALED = "sealed"


@dataclass(frozen=True)
class Page:
    """One Query page of one partition (one shard of one due-second)."""

    pk: str
    messages: list[DelayRequest]
    # The sort key to read on after; None when the partition has nothing more.
    last_key: str | None


@dataclass(frozen=True)
class Located:
    """One locator of an id: a version's due and release times, its record's timestamp and
    coordinates, the reschedule that made it (a copy), where it waits (``queued``: ingest
    sent it to the delay queue), and the stored version itself when it is still in the table.
    The record's order is what a cancel or reschedule of the id is compared with
    (:meth:`delayq.ordering.Marker.applies`), so an operator can tell the fate of a queued
    version too."""

    due_ms: int
    release_ms: int
    ts_ms: int
    queued: bool
    stored: DelayRequest | None = None
    src: str = ""
    moved_ts_ms: int = 0
    moved_src: str = ""


def _located_of(item: Item, stored: DelayRequest | None) -> Located:
    def number(name: str) -> int:
        return int(item[name]["N"]) if name in item else 0

    due_ms = number("due_ms")
    delay_id = item[c.ATTR_PK]["S"].removeprefix(c.LOCATOR_PK_PREFIX)
    return Located(
        due_ms=due_ms,
        release_ms=number(c.ATTR_RELEASE_MS) or due_ms,
        ts_ms=number(c.ATTR_TS),
        queued=item[c.ATTR_LOCATED_PK]["S"] == c.LOCATED_IN_QUEUE,
        stored=stored,
        src=item["src"]["S"] if "src" in item else delay_id,
        moved_ts_ms=number(c.ATTR_MOVED_BY_TS),
        moved_src=item.get(c.ATTR_MOVED_BY_SRC, {}).get("S", ""),
    )


LateRanges = buckets.Ranges


@dataclass(frozen=True)
class Watermark:
    """The scheduler's progress (one item, see :meth:`MessageStore.write_watermark`).

    Every message due up to ``second`` has been sent. ``cursors`` is the progress inside
    ``second + 1``: empty when it has not started; otherwise its unfinished partitions, each
    with the last sort key sent (partitions not listed are finished). ``token`` is renewed by
    every write (None for an item written before tokens existed, or not written yet).

    ``reading`` is the last due-second a scheduler run may have read: a run records its whole
    window here before its first Query, so that an ingest that stored a message and then
    reads this item knows whether a run may have missed it (``docs/internals.md``, "ingest
    guard"). None for an item written before it existed.

    ``late`` are the ranges of due-seconds the scheduler passed so late that DynamoDB's TTL
    may already have deleted some of their messages before it read them (``buckets.
    late_cutoff``): the cleanup function re-drives every TTL removal in them.
    """

    second: int
    cursors: Mapping[str, str] = field(default_factory=dict)
    token: str | None = None
    reading: int | None = None
    late: LateRanges = ()

    @property
    def guarded_through(self) -> int:
        """The last due-second that a run may have read, or passed, already: a message stored
        at or below it must be queued by whoever stored it."""
        in_progress = self.second + 1 if self.cursors else self.second
        return max(in_progress, self.reading if self.reading is not None else in_progress)

    def scheduled(self, second: int) -> bool:
        """Whether every message of ``second`` that still existed when it was read has been
        sent, and none can have been deleted by TTL before that read."""
        return second <= self.second and not any(a <= second <= b for a, b in self.late)


def message_item(request: DelayRequest, shards: int, ttl_grace_seconds: int) -> Item:
    """The stored form of a delay request (see docs/internals.md).

    Only what a reader needs is stored, so that a typical 1 KB message is one write unit:
    key and value are zlib-compressed when that makes them smaller (``key_z``, ``value_z``),
    ``src`` is left out when it equals the delay id, ``headers`` when there are none. ``size``
    stays uncompressed bytes (the reports count it). The ingest time is not stored: nothing
    read it.
    """
    # A message a release cap deferred waits in the bucket of its release time.
    release_at_ms = request.release_at_ms
    item = message_key(request, shards)
    item["kind"] = {"S": c.KIND_MESSAGE}
    item["due_ms"] = {"N": str(request.due_ms)}
    item["target"] = {"S": request.target}
    item["size"] = {"N": str(request.size)}
    item[c.ATTR_TTL] = {"N": str(buckets.expires_at(release_at_ms, ttl_grace_seconds))}
    if request.tenant:
        item[c.ATTR_TENANT] = {"S": request.tenant}
    if request.priority != c.PRIORITY_NORMAL:
        item[c.ATTR_PRIORITY] = {"S": request.priority}
    if request.release_ms:
        item[c.ATTR_RELEASE_MS] = {"N": str(request.release_ms)}
    if request.release_rank >= 0:
        item[c.ATTR_RELEASE_RANK] = {"N": str(request.release_rank)}
    if request.ts_ms:
        item[c.ATTR_TS] = {"N": str(request.ts_ms)}
    if request.moved_src:
        item[c.ATTR_MOVED_BY_TS] = {"N": str(request.moved_ts_ms)}
        item[c.ATTR_MOVED_BY_SRC] = {"S": request.moved_src}
    if request.offloaded_bytes:
        item[c.ATTR_OFFLOADED_BYTES] = {"N": str(request.offloaded_bytes)}
    if request.headers:
        item["headers"] = {"S": headers_json(request.headers)}
    if request.src != request.delay_id:
        item["src"] = {"S": request.src}
    if request.key is not None:
        name, packed = _packed(c.ATTR_KEY, c.ATTR_KEY_Z, request.key)
        item[name] = packed
    if request.value is not None:
        name, packed = _packed(c.ATTR_VALUE, c.ATTR_VALUE_Z, request.value)
        item[name] = packed
    if request.payload_ref:
        item["payload_ref"] = {"S": request.payload_ref}
    return item


def placed_away(request: DelayRequest) -> bool:
    """Whether a stored message waits away from its due second (a release cap's slot), so
    that a reschedule naming its due time needs its placement to find it."""
    return buckets.due_second(request.release_at_ms) != buckets.due_second(request.due_ms)


def locator_item(request: DelayRequest, shards: int, ttl_grace_seconds: int) -> Item:
    """Where a message waits, found by its id: ``loc#<id>``, the message's sort key, its due
    and release times, its record's timestamp and coordinates (``src`` left out when it is the
    id, as in the message item), the reschedule that made it (a copy) and the partition key
    it is stored under (``at``, or ``queue``); it expires with the message."""
    key = message_key(request, shards)
    item = {
        c.ATTR_PK: {"S": f"{c.LOCATOR_PK_PREFIX}{request.delay_id}"},
        c.ATTR_SK: key[c.ATTR_SK],
        "kind": {"S": c.KIND_LOCATOR},
        "due_ms": {"N": str(request.due_ms)},
        c.ATTR_RELEASE_MS: {"N": str(request.release_at_ms)},
        c.ATTR_TS: {"N": str(request.ts_ms)},
        c.ATTR_LOCATED_PK: key[c.ATTR_PK],
        c.ATTR_TTL: {"N": str(buckets.expires_at(request.release_at_ms, ttl_grace_seconds))},
    }
    if request.src != request.delay_id:
        item["src"] = {"S": request.src}
    if request.moved_src:
        item[c.ATTR_MOVED_BY_TS] = {"N": str(request.moved_ts_ms)}
        item[c.ATTR_MOVED_BY_SRC] = {"S": request.moved_src}
    return item


def placement_key(delay_id: str, due_ms: int) -> str:
    """The partition of the placements of ``delay_id``'s messages due in ``due_ms``'s second."""
    group = zlib.crc32(delay_id.encode("utf-8")) % c.PLACEMENT_GROUPS
    return f"{c.PLACEMENT_PK_PREFIX}{buckets.due_second(due_ms)}#{group}"


def placement_items(requests: Sequence[DelayRequest], ttl_grace_seconds: int) -> list[Item]:
    """Where a release cap placed ``requests`` (those stored away from their due second): per
    due-second and id group, items of ``[sort key, seconds after due]`` pairs. An item's sort
    key is a digest of its pairs, so the same batch stored twice writes the same items."""
    grouped: dict[str, list[tuple[str, int, int]]] = {}
    for r in requests:
        if placed_away(r):
            offset = buckets.due_second(r.release_at_ms) - buckets.due_second(r.due_ms)
            expires = buckets.expires_at(r.release_at_ms, ttl_grace_seconds)
            grouped.setdefault(placement_key(r.delay_id, r.due_ms), []).append(
                (sort_key(r), offset, expires)
            )
    items = []
    for pk, entries in grouped.items():
        for chunk in _placement_chunks(sorted(set(entries))):
            pairs = json.dumps([[key, offset] for key, offset, _ in chunk], separators=(",", ":"))
            digest = hashlib.blake2b(pairs.encode(), digest_size=12).digest()
            items.append(
                {
                    c.ATTR_PK: {"S": pk},
                    c.ATTR_SK: {"S": base64.urlsafe_b64encode(digest).decode()},
                    "kind": {"S": c.KIND_PLACEMENT},
                    c.ATTR_PLACEMENTS: {"S": pairs},
                    c.ATTR_TTL: {"N": str(max(expires for _, _, expires in chunk))},
                }
            )
    return items


def _placement_chunks(entries: list[tuple[str, int, int]]) -> Iterable[list[tuple[str, int, int]]]:
    """``entries`` in runs of at most ``PLACEMENT_MAX_ENTRIES`` and ``PLACEMENT_MAX_BYTES`` of
    sort keys (ids may be 1,000 bytes: an item stays far below DynamoDB's 400 KB)."""
    chunk: list[tuple[str, int, int]] = []
    size = 0
    for entry in entries:
        cost = len(entry[0].encode()) + 16
        if chunk and (len(chunk) >= c.PLACEMENT_MAX_ENTRIES or size + cost > c.PLACEMENT_MAX_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += cost
    if chunk:
        yield chunk


def _is_version_of(sk: str, delay_id: str) -> bool:
    """Whether a message sort key (:func:`sort_key`) is of ``delay_id``: the id alone, or the
    id and a version tag (which has no separator)."""
    if sk == delay_id:
        return True
    head, separator, tag = sk.rpartition(_VERSION_SEPARATOR)
    return bool(separator) and head == delay_id and bool(tag)


def message_key(request: DelayRequest, shards: int) -> Item:
    """The key of the stored ``request``: its release second and shard, then its id and
    version (:func:`sort_key`), so that no two records' messages share an item."""
    second = buckets.due_second(request.release_at_ms)
    return {
        c.ATTR_PK: {"S": buckets.bucket_key(second, buckets.shard_of(request.delay_id, shards))},
        c.ATTR_SK: {"S": sort_key(request)},
    }


def sort_key(request: DelayRequest) -> str:
    """``<id>#<version tag>``: the tag names the record this version comes from (the
    reschedule that made a copy, else the message's own record). A message whose id is its
    own coordinates (the default id) is just ``<id>``."""
    version = request.moved_src or request.src
    if version == request.delay_id:
        return request.delay_id
    return f"{request.delay_id}{_VERSION_SEPARATOR}{_version_tag(version)}"


_VERSION_SEPARATOR: Final = "#"


def _version_tag(version_src: str) -> str:
    # 48 bits: two records of one id in one second and shard never share a tag in practice,
    # and a 1 KB message stays one write unit.
    digest = hashlib.blake2b(version_src.encode(), digest_size=6).digest()
    return base64.urlsafe_b64encode(digest).decode()


def _delay_id_of(item: Item, src: str | None, moved_src: str) -> str:
    """The id in a stored item's sort key (items written before versions have the id alone)."""
    sk: str = item[c.ATTR_SK]["S"]
    version = moved_src or src
    if version is not None:
        suffix = f"{_VERSION_SEPARATOR}{_version_tag(version)}"
        if sk.endswith(suffix):
            return sk[: -len(suffix)]
    return sk


def id_of_sort_key(item: Item) -> str:
    """The delay id of a stored message item (or stream image)."""
    return _delay_id_of(
        item,
        item["src"]["S"] if "src" in item else None,
        item.get(c.ATTR_MOVED_BY_SRC, {}).get("S", ""),
    )


def request_from_item(item: Item) -> DelayRequest:
    """Inverse of :func:`message_item`, for items of every version (earlier items have
    ``src``, ``headers`` and plain ``key`` / ``value`` always) and for stream images."""
    delay_id = id_of_sort_key(item)
    return DelayRequest(
        delay_id=delay_id,
        target=item["target"]["S"],
        due_ms=int(item["due_ms"]["N"]),
        key=_unpacked(item, c.ATTR_KEY, c.ATTR_KEY_Z),
        value=_unpacked(item, c.ATTR_VALUE, c.ATTR_VALUE_Z),
        headers=headers_from_json(item["headers"]["S"]) if "headers" in item else (),
        src=item["src"]["S"] if "src" in item else delay_id,
        payload_ref=item.get("payload_ref", {}).get("S"),
        ts_ms=int(item[c.ATTR_TS]["N"]) if c.ATTR_TS in item else 0,
        offloaded_bytes=(
            int(item[c.ATTR_OFFLOADED_BYTES]["N"]) if c.ATTR_OFFLOADED_BYTES in item else 0
        ),
        tenant=item.get(c.ATTR_TENANT, {}).get("S", ""),
        priority=item.get(c.ATTR_PRIORITY, {}).get("S", c.PRIORITY_NORMAL),
        release_ms=int(item[c.ATTR_RELEASE_MS]["N"]) if c.ATTR_RELEASE_MS in item else 0,
        release_rank=(int(item[c.ATTR_RELEASE_RANK]["N"]) if c.ATTR_RELEASE_RANK in item else -1),
        moved_ts_ms=int(item[c.ATTR_MOVED_BY_TS]["N"]) if c.ATTR_MOVED_BY_TS in item else 0,
        moved_src=item.get(c.ATTR_MOVED_BY_SRC, {}).get("S", ""),
    )


# Shorter keys and values are stored as they are: zlib's frame takes 6 of the few bytes it
# could save, and a call costs half of what compressing a kilobyte does.
_MIN_PACKED_BYTES: Final = 64


def _packed(plain: str, compressed: str, raw: bytes) -> tuple[str, Item]:
    """``(attribute name, typed value)`` of a key or value: compressed when that is smaller."""
    # zlib's default level: at 1 KB it costs ~1 us more than level 1 and saves ~10 B; on
    # larger values every KB saved is a write unit, worth far more than the CPU.
    if len(raw) < _MIN_PACKED_BYTES:
        return plain, {"B": raw}
    packed = zlib.compress(raw, c.STORE_ZLIB_LEVEL)
    if len(compressed) + len(packed) < len(plain) + len(raw):
        return compressed, {"B": packed}
    return plain, {"B": raw}


def _unpacked(item: Item, plain: str, compressed: str) -> bytes | None:
    if compressed not in item:
        return _binary(item.get(plain))
    packed = _binary(item[compressed]) or b""
    # No stored value is larger than an SQS body (ingest offloads larger ones to S3): more
    # is not ours, and is not worth the memory to find out.
    unpacker = zlib.decompressobj()
    try:
        raw = unpacker.decompress(packed, c.SQS_MAX_MESSAGE_BYTES)
    except zlib.error as e:
        raise StoreError(f"item {item[c.ATTR_SK]['S']!r}: {compressed} is not zlib data") from e
    if unpacker.unconsumed_tail or not unpacker.eof:
        raise StoreError(f"item {item[c.ATTR_SK]['S']!r}: {compressed} is truncated or too large")
    return raw


def _binary(attr: dict[str, Any] | None) -> bytes | None:
    if attr is None:
        return None
    raw = attr["B"]
    # The low-level client gives bytes; stream records (JSON) give base64 text.
    if isinstance(raw, str):
        return base64.b64decode(raw)
    return bytes(raw)


def condition_failed(error: StoreError) -> bool:
    """Whether a translated error is DynamoDB refusing a conditional write."""
    cause = error.__cause__
    return isinstance(cause, ClientError) and (
        cause.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"
    )


def cancelled_by(error: StoreError) -> list[str]:
    """The code of each item of a cancelled transaction (the string ``"None"`` for the items
    that would have held), in the transaction's order; empty for any other error."""
    cause = error.__cause__
    return cancellation_codes(cause) if isinstance(cause, ClientError) else []


def cancel_key(delay_id: str, shards: int) -> Item:
    """The key of a cancel marker."""
    return {
        c.ATTR_PK: {"S": f"{c.CANCEL_PK_PREFIX}{buckets.shard_of(delay_id, shards)}"},
        c.ATTR_SK: {"S": delay_id},
    }


def _raise_first(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; raise the first error, if any, once all are done."""
    errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def _marker_of(item: Item) -> Marker:
    def pair(ts_name: str, src_name: str) -> tuple[int, str] | None:
        if ts_name not in item:
            return None
        return int(item[ts_name]["N"]), item.get(src_name, {}).get("S", "")

    cancel = pair(c.ATTR_CANCEL_TS, c.ATTR_CANCEL_SRC)
    moved = pair(c.ATTR_RESCHEDULE_TS, c.ATTR_RESCHEDULE_SRC)
    if cancel is None and moved is None:
        # A marker written before cancels carried times cancels every message.
        cancel = (2**62, "")
    due = item.get(c.ATTR_RESCHEDULE_DUE_MS, {}).get("N")
    return Marker(cancel, moved, None if due is None else int(due))


def _chunks(items: Sequence[T], size: int) -> Iterable[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def query_pool(shards: int, query_workers: int = 16) -> ThreadPoolExecutor:
    """The pool a store runs its parallel queries and marker writes on unless given one: a
    thread per shard, at most ``query_workers``."""
    return ThreadPoolExecutor(max_workers=max(1, min(query_workers, shards)))


class MessageStore:
    """The message table. Construct once per container; the client is injected."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        shards: int,
        ttl_grace_seconds: int,
        max_delay_seconds: int,
        backoff: Backoff | None = None,
        query_workers: int = 16,
        executor: Executor | None = None,
        index_all: bool = False,
    ) -> None:
        self._client = client
        self._table = table_name
        self._shards = shards
        self._ttl_grace = ttl_grace_seconds
        self._max_delay = max_delay_seconds
        self._backoff = backoff or Backoff()
        # ``executor``: where parallel queries and marker writes run (default: a pool).
        self._pool = executor or query_pool(shards, query_workers)
        # The id index (``Settings.id_index``): a locator for every message, not only those a
        # release cap stores away from their due second.
        self.index_all = index_all

    # --- writes --------------------------------------------------------------------------

    def put_messages(
        self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline
    ) -> None:
        """Store messages (TTL = release + grace), with the placements of those a release cap
        stored away from their due second, and (id index on) a locator each. The same record
        stored twice is one item."""
        items = [message_item(r, self._shards, self._ttl_grace) for r in requests]
        items += placement_items(requests, self._ttl_grace)
        if self.index_all:
            items += [locator_item(r, self._shards, self._ttl_grace) for r in requests]
        self._batch_write("store messages", items, deadline)

    def put_queued_locators(self, requests: Sequence[DelayRequest], deadline: Deadline) -> None:
        """With the id index on, the locators of messages ingest sent to the delay queue
        (``at`` = ``queue``); without it, nothing."""
        if not self.index_all or not requests:
            return
        items = []
        for r in requests:
            item = locator_item(r, self._shards, self._ttl_grace)
            item[c.ATTR_LOCATED_PK] = {"S": c.LOCATED_IN_QUEUE}
            items.append(item)
        self._batch_write("store locators", items, deadline)

    def put_cancels(
        self, cancels: Sequence[CancelRequest], now_ms: int, deadline: Deadline
    ) -> None:
        """Record cancels: one marker per id holding the latest cancel (its record's
        timestamp and coordinates), so that it applies to the messages written before it and
        not to a later message that reuses the id (``delayq.ordering.cancel_covers``).

        A marker outlives every message it can cancel: the longest delay, the TTL grace, and
        the longest a message may then wait in a dead-letter queue before a redrive.
        Conditional writes keep the latest cancel whatever order cancels are processed in
        (they may come from different partitions); cancels are rare, so one UpdateItem each,
        in parallel, costs nothing the other messages pay.
        """
        latest: dict[str, CancelRequest] = {}
        for cancel in cancels:
            kept = latest.get(cancel.delay_id)
            if kept is None or record_order(cancel.ts_ms, cancel.src) > record_order(
                kept.ts_ms, kept.src
            ):
                latest[cancel.delay_id] = cancel
        expires = self._marker_expires(now_ms)
        self._raise_clocks([(x.delay_id, x.ts_ms, deadline) for x in latest.values()], now_ms)
        futures = [
            self._pool.submit(self._put_cancel, cancel, now_ms, expires, deadline)
            for cancel in latest.values()
        ]
        _raise_first(futures)

    def _marker_expires(self, now_ms: int) -> int:
        # Longer than any message it can apply to lives: the longest delay and release spread,
        # then the longest a message may wait after its release (TTL lag, outages, dead letters).
        life = self._max_delay + c.MAX_RELEASE_SPREAD_SECONDS + c.LIFE_AFTER_RELEASE_SECONDS
        return now_ms // 1000 + life

    def put_reschedules(
        self,
        reschedules: Sequence[tuple[RescheduleRequest, int, Deadline]],
        now_ms: int,
    ) -> list[RescheduleWrite]:
        """Record reschedules ``(reschedule, the release second of the version it moves,
        deadline)`` in the marker items of their ids, each within its deadline (its cutoff).

        First the control clocks are raised; then each marker is written in a transaction
        that holds only while no emitter has sealed the old release second
        (``control_clock``), so a write that lands after an emitter read the markers changes
        nothing. A later reschedule of the id already recorded wins, whatever order they are
        processed in."""
        expires = self._marker_expires(now_ms)
        self._raise_clocks([(r.delay_id, r.ts_ms, d) for r, _, d in reschedules], now_ms)
        futures = [
            self._pool.submit(self._put_reschedule, r, second, now_ms, expires, d)
            for r, second, d in reschedules
        ]
        _raise_first(futures)
        return [f.result() for f in futures]

    def _put_reschedule(
        self,
        reschedule: RescheduleRequest,
        release_second: int,
        now_ms: int,
        expires: int,
        deadline: Deadline,
    ) -> RescheduleWrite:
        if deadline.expired():
            # Its cutoff passed before the write could start (delayq.reschedule).
            raise StoreError(f"reschedule {reschedule.src} not recorded before its cutoff")
        shard, _ = control_clock.shard_and_bucket(reschedule.delay_id, self._shards)
        unsealed = {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": control_clock.clock_key(shard),
                "ConditionExpression": "attribute_not_exists(#z) OR #z < :z",
                "ExpressionAttributeNames": {"#z": control_clock.ATTR_SEAL},
                "ExpressionAttributeValues": {":z": {"N": str(release_second)}},
            }
        }
        marker = self._marker_update(
            reschedule.delay_id,
            {
                c.ATTR_RESCHEDULE_ORDER: {"S": order_token(reschedule.ts_ms, reschedule.src)},
                c.ATTR_RESCHEDULE_TS: {"N": str(reschedule.ts_ms)},
                c.ATTR_RESCHEDULE_SRC: {"S": reschedule.src},
                c.ATTR_RESCHEDULE_DUE_MS: {"N": str(reschedule.due_ms)},
                "rescheduled_ms": {"N": str(now_ms)},
            },
            expires,
        )
        try:
            self._call(
                "store reschedule marker",
                lambda: self._client.transact_write_items(
                    TransactItems=[unsealed, {"Update": marker}]  # type: ignore[list-item,typeddict-item]
                ),
                deadline,
            )
        except StoreError as e:
            reasons = cancelled_by(e)
            if reasons[1:2] == ["ConditionalCheckFailed"]:
                return RescheduleWrite.SUPERSEDED
            if reasons[:1] == ["ConditionalCheckFailed"]:
                # An earlier try of this write (a timed-out one) may have landed before the
                # seal; the seal stops any other, so the marker now says which.
                found = self.markers([reschedule.delay_id], deadline).get(reschedule.delay_id)
                landed = found is not None and found.rescheduled_by(reschedule)
                return RescheduleWrite.RECORDED if landed else RescheduleWrite.SEALED
            raise
        return RescheduleWrite.RECORDED

    def _put_cancel(
        self, cancel: CancelRequest, now_ms: int, expires: int, deadline: Deadline
    ) -> None:
        # False: a later cancel of this id is already recorded; it covers all this one does.
        self._put_marker(
            "store cancel marker",
            cancel.delay_id,
            values={
                c.ATTR_CANCEL_ORDER: {"S": order_token(cancel.ts_ms, cancel.src)},
                c.ATTR_CANCEL_TS: {"N": str(cancel.ts_ms)},
                c.ATTR_CANCEL_SRC: {"S": cancel.src},
                "cancelled_ms": {"N": str(now_ms)},
            },
            expires=expires,
            deadline=deadline,
        )

    def _put_marker(
        self,
        operation: str,
        delay_id: str,
        *,
        values: Mapping[str, Item],
        expires: int,
        deadline: Deadline,
    ) -> bool:
        """Set ``values`` on the marker of ``delay_id`` (:meth:`_marker_update`) unless it
        holds a later record already: False then. One conditional UpdateItem. The caller
        raised the id's control clock first (:meth:`_raise_clocks`)."""
        update = self._marker_update(delay_id, values, expires)
        try:
            self._call(operation, lambda: self._client.update_item(**update), deadline)
        except StoreError as e:
            if not condition_failed(e):
                raise
            return False
        return True

    def _marker_update(self, delay_id: str, values: Mapping[str, Item], expires: int) -> Item:
        """The UpdateItem that sets ``values`` (attribute -> typed value; the first is the
        record's order token, the second its timestamp) on the marker of ``delay_id`` unless
        it holds a later record. Markers written before order tokens are compared by
        timestamp."""
        names = {f"#a{i}": name for i, name in enumerate(values)}
        attribute_values: Item = {f":a{i}": v for i, v in enumerate(values.values())}
        assignments = ", ".join(f"#a{i} = :a{i}" for i in range(len(values)))
        return {
            "TableName": self._table,
            "Key": cancel_key(delay_id, self._shards),
            "UpdateExpression": f"SET kind = :kind, #ttl = :expires, {assignments}",
            "ConditionExpression": (
                "(attribute_not_exists(#a0) AND (attribute_not_exists(#a1) OR #a1 <= :a1))"
                " OR #a0 <= :a0"
            ),
            "ExpressionAttributeNames": {**names, "#ttl": c.ATTR_TTL},
            "ExpressionAttributeValues": {
                **attribute_values,
                ":kind": {"S": c.KIND_CANCEL},
                ":expires": {"N": str(expires)},
            },
        }

    def _raise_clocks(self, controls: Sequence[tuple[str, int, Deadline]], now_ms: int) -> None:
        """Raise the control clock of each ``(id, record timestamp, deadline)`` before its
        marker is written, so that an emitter that sees the marker's effect cannot have
        skipped its read: one raise per bucket (its latest second), the buckets of one shard
        one after another (one item), the shards in parallel."""
        latest: dict[tuple[int, str], tuple[int, Deadline]] = {}
        for delay_id, ts_ms, deadline in controls:
            if deadline.expired():
                continue  # its marker is not written either (a reschedule past its cutoff)
            key = control_clock.shard_and_bucket(delay_id, self._shards)
            second = control_clock.record_second(ts_ms)
            if key not in latest or second > latest[key][0]:
                latest[key] = (second, deadline)
        by_shard: dict[int, list[tuple[str, int, Deadline]]] = {}
        for (shard, bucket), (second, deadline) in sorted(latest.items()):
            by_shard.setdefault(shard, []).append((bucket, second, deadline))

        def raise_shard(shard: int, raises: list[tuple[str, int, Deadline]]) -> None:
            for bucket, second, deadline in raises:
                self._update_clock(shard, bucket, second, now_ms, deadline)

        _raise_first([self._pool.submit(raise_shard, s, r) for s, r in by_shard.items()])

    def seal(self, seconds: Mapping[int, int], now_ms: int, deadline: Deadline) -> None:
        """Seal each shard's clock at a release second (``{shard: second}``) before reading
        the clocks and markers of stored messages released up to it: a reschedule's marker
        write that lands later fails (``control_clock``). In parallel; a later seal already
        there stays."""
        _raise_first(
            [
                self._pool.submit(
                    self._update_clock, shard, control_clock.ATTR_SEAL, second, now_ms, deadline
                )
                for shard, second in seconds.items()
            ]
        )

    def _update_clock(
        self, shard: int, attribute: str, value: int, now_ms: int, deadline: Deadline
    ) -> None:
        """Raise ``attribute`` of ``shard``'s control clock (a bucket or the seal) to
        ``value``, the clock created with its floor if missing; a larger value already there
        stays."""
        try:
            self._call(
                f"update control clock {attribute}",
                lambda: self._client.update_item(
                    TableName=self._table,
                    Key=control_clock.clock_key(shard),
                    UpdateExpression="SET #f = if_not_exists(#f, :floor), kind = :kind, #b = :s",
                    ConditionExpression="attribute_not_exists(#b) OR #b < :s",
                    ExpressionAttributeNames={"#f": control_clock.ATTR_FLOOR, "#b": attribute},
                    ExpressionAttributeValues={
                        ":floor": {"N": str(control_clock.floor_for(now_ms))},
                        ":kind": {"S": control_clock.KIND_CLOCK},
                        ":s": {"N": str(value)},
                    },
                ),
                deadline,
            )
        except StoreError as e:
            if not condition_failed(e):
                raise

    def control_clocks(
        self, shards: Iterable[int], now_ms: int, deadline: Deadline
    ) -> dict[int, control_clock.ControlClock]:
        """The control clock of each shard, strongly consistent; a missing one is created
        (its floor counts every marker written before it, ``FLOOR_MARGIN_SECONDS``)."""
        wanted = sorted(set(shards))
        items = self._batch_get(
            "read control clocks", [control_clock.clock_key(s) for s in wanted], deadline
        )
        clocks = {
            int(i[c.ATTR_PK]["S"].removeprefix(control_clock.CLOCK_PK_PREFIX)): (
                control_clock.clock_of(i)
            )
            for i in items
        }
        for shard in wanted:
            if shard not in clocks:
                clocks[shard] = self._create_clock(shard, now_ms, deadline)
        return clocks

    def _create_clock(
        self, shard: int, now_ms: int, deadline: Deadline
    ) -> control_clock.ControlClock:
        response = self._call(
            "create control clock",
            lambda: self._client.update_item(
                TableName=self._table,
                Key=control_clock.clock_key(shard),
                UpdateExpression="SET #f = if_not_exists(#f, :floor), kind = :kind",
                ExpressionAttributeNames={"#f": control_clock.ATTR_FLOOR},
                ExpressionAttributeValues={
                    ":floor": {"N": str(control_clock.floor_for(now_ms))},
                    ":kind": {"S": control_clock.KIND_CLOCK},
                },
                ReturnValues="ALL_NEW",
            ),
            deadline,
        )
        return control_clock.clock_of(response["Attributes"])

    def claim_counter(
        self,
        pk: str,
        amount: int,
        claim: str,
        expires_s: int,
        deadline: Deadline,
        *,
        counter: str = "n",
        span_end: int = -1,
    ) -> tuple[int, int]:
        """Add ``amount`` to the counter item ``pk`` once per ``claim`` (an attribute name
        that identifies the records counted); returns the counter's value before the claim's
        add and the claim's ``span_end``, the same on every replay of it (a lost response, a
        redelivered batch): the add itself keeps both under the claim's name (``claim`` and
        ``claim`` + ``/``). ``span_end``: the last source offset the claim counts (-1: none).
        A replay costs one failed conditional write and one strongly consistent read.
        ``counter``: the attribute counted (``n``; ``l`` for late messages under strict caps)."""
        span = f"{claim}/"
        expression = (
            "SET #c = if_not_exists(#n, :zero), #s = :span, kind = :kind, #ttl = :expires "
            "ADD #n :amount"
        )
        names = {"#n": counter, "#c": claim, "#s": span, "#ttl": c.ATTR_TTL}
        try:
            response = self._call(
                "claim counter",
                lambda: self._client.update_item(
                    TableName=self._table,
                    Key={c.ATTR_PK: {"S": pk}, c.ATTR_SK: {"S": "-"}},
                    UpdateExpression=expression,
                    ConditionExpression="attribute_not_exists(#c)",
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues={
                        ":amount": {"N": str(amount)},
                        ":zero": {"N": "0"},
                        ":span": {"N": str(span_end)},
                        ":kind": {"S": c.KIND_COUNTER},
                        ":expires": {"N": str(expires_s)},
                    },
                    ReturnValues="UPDATED_NEW",
                ),
                deadline,
            )
        except StoreError as e:
            if not condition_failed(e):
                raise
        else:
            return int(response["Attributes"][counter]["N"]) - amount, span_end
        # Claimed before (its response was lost, or the batch is a replay).
        item = self._call(
            "read counter claim",
            lambda: self._client.get_item(
                TableName=self._table,
                Key={c.ATTR_PK: {"S": pk}, c.ATTR_SK: {"S": "-"}},
                ConsistentRead=True,
                ProjectionExpression="#c, #s",
                ExpressionAttributeNames={"#c": claim, "#s": span},
            ),
            deadline,
        )["Item"]
        return int(item[claim]["N"]), int(item.get(span, {"N": str(span_end)})["N"])

    def late_counts(self, keys: Sequence[str], deadline: Deadline) -> dict[str, int]:
        """The late messages counted in each counter item ``keys`` (``rate#<tenant>#<second>``),
        strongly consistent; 0 for a counter that has none."""
        unique = sorted(set(keys))
        items = self._batch_get(
            "read late counts",
            [{c.ATTR_PK: {"S": k}, c.ATTR_SK: {"S": "-"}} for k in unique],
            deadline,
            projection=(c.ATTR_PK, "#l"),
            names={"#l": c.ATTR_LATE_COUNT},
        )
        found = {
            i[c.ATTR_PK]["S"]: int(i[c.ATTR_LATE_COUNT]["N"])
            for i in items
            if c.ATTR_LATE_COUNT in i
        }
        return {k: found.get(k, 0) for k in unique}

    def put_item(self, item: Item, deadline: Deadline) -> None:
        """One plain PutItem (stats items)."""
        self._call(
            "put item",
            lambda: self._client.put_item(TableName=self._table, Item=item),
            deadline,
        )

    def _batch_write(self, operation: str, items: Sequence[Item], deadline: Deadline) -> None:
        # BatchWriteItem rejects a batch holding one key twice: the last write of a key wins.
        unique = {(i[c.ATTR_PK]["S"], i[c.ATTR_SK]["S"]): i for i in items}
        for chunk in _chunks(list(unique.values()), c.DYNAMODB_BATCH_WRITE_ITEMS):
            retry_partial(operation, self._write_chunk, chunk, self._backoff, deadline)

    def _write_chunk(self, chunk: list[Item]) -> list[Item]:
        try:
            response = self._client.batch_write_item(
                RequestItems={self._table: [{"PutRequest": {"Item": i}} for i in chunk]}
            )
        except AWS_ERRORS as e:
            if is_retryable(e):
                raise
            raise StoreError(f"BatchWriteItem failed: {e}") from e
        unprocessed = response.get("UnprocessedItems", {}).get(self._table, [])
        return [u["PutRequest"]["Item"] for u in unprocessed]

    # --- reads ---------------------------------------------------------------------------

    def query_pages(
        self,
        starts: Sequence[tuple[str, str | None]],
        limit: int,
        now_ms: int,
        deadline: Deadline,
    ) -> list[Page]:
        """One Query page of each ``(partition key, sort key to read on after, or None)``, in
        parallel (one partition per call), in the order asked. A page reads at most ``limit``
        items (and at most 1 MB), so memory holds ``len(starts)`` pages whatever a partition's
        size.

        Reads are strongly consistent: a message whose write completed before the Query is
        in its answer (the ingest guard depends on it, ``docs/internals.md``). Expired items
        that TTL has not deleted yet are returned like the others: whatever the scheduler has
        not passed was never sent, so it is sent late rather than dropped.
        """
        return list(self._pool.map(lambda s: self._query_page(s[0], s[1], limit, deadline), starts))

    def _query_page(self, pk: str, after: str | None, limit: int, deadline: Deadline) -> Page:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
            "Limit": limit,
        }
        if after is not None:
            kwargs["ExclusiveStartKey"] = {c.ATTR_PK: {"S": pk}, c.ATTR_SK: {"S": after}}
        page = self._call("query due-second", partial(self._client.query, **kwargs), deadline)
        last = page.get("LastEvaluatedKey")
        return Page(
            pk,
            [request_from_item(i) for i in page.get("Items", [])],
            last[c.ATTR_SK]["S"] if last else None,
        )

    def markers(self, delay_ids: Iterable[str], deadline: Deadline) -> dict[str, Marker]:
        """The control item of each id that has one (its latest cancel and reschedule).

        Strongly consistent: a cancel or reschedule whose write completed before this read is
        seen (the cancel and reschedule guarantees rest on it).
        """
        keys = [cancel_key(i, self._shards) for i in sorted(set(delay_ids))]
        names = {
            "#cts": c.ATTR_CANCEL_TS,
            "#csrc": c.ATTR_CANCEL_SRC,
            "#mts": c.ATTR_RESCHEDULE_TS,
            "#msrc": c.ATTR_RESCHEDULE_SRC,
            "#mdue": c.ATTR_RESCHEDULE_DUE_MS,
        }
        items = self._batch_get(
            "read cancel markers", keys, deadline, projection=("sk", *names), names=names
        )
        return {item[c.ATTR_SK]["S"]: _marker_of(item) for item in items}

    def cancelled(
        self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline
    ) -> list[bool]:
        """For each request, whether a cancel or a reschedule applies to it
        (:meth:`Marker.applies`): two messages with one id may differ, when the id was
        cancelled or rescheduled between them. Reads the clocks of the requests' shards
        (sealing first, and reading again, those not sealed up to the release second of a
        movable request: ``control_clock``), then only the markers they do not rule out."""
        if not requests:
            return []
        shards = [buckets.shard_of(r.delay_id, self._shards) for r in requests]
        clocks = self.control_clocks(shards, now_ms, deadline)
        needed: dict[int, int] = {}
        for r, shard in zip(requests, shards, strict=True):
            if r.movable:
                needed[shard] = max(needed.get(shard, 0), buckets.due_second(r.release_at_ms))
        unsealed = {s: second for s, second in needed.items() if clocks[s].sealed < second}
        if unsealed:
            self.seal(unsealed, now_ms, deadline)
            clocks.update(self.control_clocks(unsealed, now_ms, deadline))
        to_read = [
            r
            for r, shard in zip(requests, shards, strict=True)
            if clocks[shard].may_apply(r, self._shards)
        ]
        markers = self.markers([r.delay_id for r in to_read], deadline) if to_read else {}
        return [r.delay_id in markers and markers[r.delay_id].applies(r) for r in requests]

    def versions_at(
        self, wanted: Sequence[tuple[str, int]], deadline: Deadline, *, placed: bool = True
    ) -> dict[tuple[str, int], list[DelayRequest]]:
        """Every stored version of each ``(id, due time)``: the messages with that id due in
        that second, wherever they wait (their due second, or the release slot a cap gave
        them, found by its placement), strongly consistent, the Queries in parallel (what a
        reschedule moves and a lookup shows; a message that was due within the horizon when
        ingested was never stored). Pairs with none map to an empty list. ``placed=False``:
        only the due seconds' own buckets (what a reschedule's copy, never placed, needs)."""
        unique = sorted(set(wanted))
        in_buckets = self._pool.map(lambda w: self._versions(w[0], w[1], deadline), unique)
        found = dict(zip(unique, in_buckets, strict=True))
        if not placed:
            return found
        placements = self._pool.map(lambda w: self._placed(w[0], w[1], deadline), unique)
        away = {w: keys for w, keys in zip(unique, placements, strict=True) if keys}
        wanted_keys = {
            (k[c.ATTR_PK]["S"], k[c.ATTR_SK]["S"]): k for ks in away.values() for k in ks
        }
        fetched = self._batch_get("read placed versions", list(wanted_keys.values()), deadline)
        by_key = {
            (i[c.ATTR_PK]["S"], i[c.ATTR_SK]["S"]): request_from_item(i)
            for i in fetched
            if i.get("kind", {}).get("S") == c.KIND_MESSAGE
        }
        for (delay_id, at_ms), keys in away.items():
            versions = found[(delay_id, at_ms)]
            seen = {sort_key(v) for v in versions}
            for k in keys:
                v = by_key.get((k[c.ATTR_PK]["S"], k[c.ATTR_SK]["S"]))
                if v is not None and v.delay_id == delay_id and sort_key(v) not in seen:
                    seen.add(sort_key(v))
                    versions.append(v)
        return found

    def _placed(self, delay_id: str, at_ms: int, deadline: Deadline) -> list[Item]:
        """The keys of ``delay_id``'s messages due in ``at_ms``'s second that a release cap
        stored in later seconds (their placements)."""
        second = buckets.due_second(at_ms)
        shard = buckets.shard_of(delay_id, self._shards)
        keys: list[Item] = []
        for item in self._query_all(
            "read placements", placement_key(delay_id, at_ms), None, deadline
        ):
            for key, offset in json.loads(item.get(c.ATTR_PLACEMENTS, {}).get("S", "[]")):
                if _is_version_of(key, delay_id):
                    keys.append(
                        {
                            c.ATTR_PK: {"S": buckets.bucket_key(second + offset, shard)},
                            c.ATTR_SK: {"S": key},
                        }
                    )
        return keys

    def located(self, delay_ids: Sequence[str], deadline: Deadline) -> dict[str, list[Located]]:
        """Every locator of each id (strongly consistent), with the stored version it points
        at when that is still in the table (``Located.stored``)."""
        ids = sorted(set(delay_ids))
        items = dict(
            zip(ids, self._pool.map(lambda i: self._located(i, deadline), ids), strict=True)
        )
        keys = {
            (i[c.ATTR_LOCATED_PK]["S"], i[c.ATTR_SK]["S"]): {
                c.ATTR_PK: i[c.ATTR_LOCATED_PK],
                c.ATTR_SK: i[c.ATTR_SK],
            }
            for found in items.values()
            for i in found
            if i[c.ATTR_LOCATED_PK]["S"] != c.LOCATED_IN_QUEUE
        }
        fetched = self._batch_get("read located versions", list(keys.values()), deadline)
        versions = {
            (i[c.ATTR_PK]["S"], i[c.ATTR_SK]["S"]): request_from_item(i)
            for i in fetched
            if i.get("kind", {}).get("S") == c.KIND_MESSAGE
        }
        return {
            delay_id: [
                _located_of(i, versions.get((i[c.ATTR_LOCATED_PK]["S"], i[c.ATTR_SK]["S"])))
                for i in found
            ]
            for delay_id, found in items.items()
        }

    def _versions(self, delay_id: str, at_ms: int, deadline: Deadline) -> list[DelayRequest]:
        """The versions of ``delay_id`` due and waiting in ``at_ms``'s second."""
        second = buckets.due_second(at_ms)
        items = self._query_all(
            "read versions of an id",
            buckets.bucket_key(second, buckets.shard_of(delay_id, self._shards)),
            delay_id,
            deadline,
        )
        versions = [
            request_from_item(i)
            for i in items
            if i.get("kind", {}).get("S") == c.KIND_MESSAGE and id_of_sort_key(i) == delay_id
        ]
        return [v for v in versions if buckets.due_second(v.due_ms) == second]

    def _located(self, delay_id: str, deadline: Deadline) -> list[Item]:
        """The locators of ``delay_id`` (its messages stored away from their due second)."""
        items = self._query_all(
            "read locators of an id", f"{c.LOCATOR_PK_PREFIX}{delay_id}", None, deadline
        )
        return [i for i in items if i.get("kind", {}).get("S") == c.KIND_LOCATOR]

    def _query_all(
        self, operation: str, pk: str, prefix: str | None, deadline: Deadline
    ) -> list[Item]:
        """Every item of partition ``pk`` (whose sort key begins with ``prefix``), strongly
        consistent, page after page."""
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        if prefix is not None:
            kwargs["KeyConditionExpression"] += " AND begins_with(sk, :prefix)"
            kwargs["ExpressionAttributeValues"][":prefix"] = {"S": prefix}
        items: list[Item] = []
        while True:
            page = self._call(operation, partial(self._client.query, **kwargs), deadline)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _batch_get(
        self,
        operation: str,
        keys: Sequence[Item],
        deadline: Deadline,
        *,
        projection: Sequence[str] = (),
        names: Mapping[str, str] | None = None,
    ) -> list[Item]:
        """Strongly consistent BatchGetItem of ``keys``, 100 a call, unprocessed keys retried."""
        found: list[Item] = []

        def request(pending: list[Item]) -> KeysAndAttributesTypeDef:
            spec: KeysAndAttributesTypeDef = {"Keys": pending, "ConsistentRead": True}
            if projection:
                spec["ProjectionExpression"] = ", ".join(projection)
            if names:
                spec["ExpressionAttributeNames"] = dict(names)
            return spec

        for chunk in _chunks(keys, c.DYNAMODB_BATCH_GET_KEYS):

            def get(pending: list[Item]) -> list[Item]:
                response = self._call(
                    operation,
                    lambda: self._client.batch_get_item(
                        RequestItems={self._table: request(pending)}
                    ),
                    deadline,
                )
                found.extend(response["Responses"].get(self._table, []))
                unprocessed = response.get("UnprocessedKeys", {}).get(self._table)
                return list(unprocessed.get("Keys", [])) if unprocessed is not None else []

            retry_partial(operation, get, chunk, self._backoff, deadline)
        return found

    # --- the watermark -------------------------------------------------------------------

    def read_watermark(self, deadline: Deadline) -> Watermark | None:
        """The scheduler's progress, or None before the first run. Cursors that are not for
        the second after the watermark (left by an older version that moved the second
        without clearing them) mean no progress inside it."""
        response = self._call(
            "read watermark",
            lambda: self._client.get_item(
                TableName=self._table,
                Key=_WATERMARK_KEY,
                ConsistentRead=True,
            ),
            deadline,
        )
        item = response.get("Item")
        if not item:
            return None
        second = int(item[c.ATTR_WATERMARK_SECOND]["N"])
        stored = item.get(c.ATTR_WATERMARK_CURSORS, {}).get("M", {})
        cursors = {
            pk: sk["S"]
            for pk, sk in stored.items()
            if buckets.parse_bucket_key(pk)[0] == second + 1
        }
        token = item.get(c.ATTR_WATERMARK_TOKEN, {}).get("S")
        reading = item.get(c.ATTR_WATERMARK_READING, {}).get("N")
        late = item.get(c.ATTR_WATERMARK_LATE, {}).get("S", "")
        return Watermark(
            second,
            cursors,
            token,
            None if reading is None else int(reading),
            buckets.parse_ranges(late),
        )

    def create_watermark(self, second: int, now_ms: int, deadline: Deadline) -> Watermark:
        """Write the first progress item: nothing is scheduled up to ``second``, nothing read
        beyond it. Ingest creates it before any stored message can be missed, at a second
        below every due-second it stores (``docs/internals.md``). Raises
        :class:`WatermarkConflictError` when it exists already."""
        return self.write_watermark(None, Watermark(second, reading=second), now_ms, deadline)

    def write_watermark(
        self, old: Watermark | None, new: Watermark, now_ms: int, deadline: Deadline
    ) -> Watermark:
        """Replace the progress ``old`` (as read or last written; None: none yet) by ``new``
        with a fresh token; returns what was written.

        The write is conditional, so that two schedulers never both record progress:

        - none yet: the item must not exist;
        - progress inside the same second: the token must be the one of ``old``, so any other
          write since (another run's cursors or its move past the second) fails this one and
          its run stops: two runs never both work through one crowded second;
        - moving past seconds: the second must still be ``old.second``. Whoever moves past
          seconds has sent everything from the progress it read up to the new one, so cursors
          another run recorded in between mark messages this run sent too. (Also the rule for
          an item written before tokens existed.)

        ``new.reading`` is written when it is not None (a run records its window before
        reading it); otherwise the stored one is kept. ``new.late`` replaces the stored ranges.

        Raises :class:`WatermarkConflictError` when the condition fails.
        """
        values: Item = {
            ":second": {"N": str(new.second)},
            ":cursors": {"M": {pk: {"S": sk} for pk, sk in new.cursors.items()}},
            ":token": {"S": uuid.uuid4().hex},
            ":now": {"N": str(now_ms)},
            ":kind": {"S": c.KIND_WATERMARK},
            ":late": {"S": buckets.format_ranges(new.late)},
        }
        update = "SET #s = :second, #c = :cursors, #t = :token, updated_ms = :now, kind = :kind"
        update += ", #l = :late"
        names = {
            "#s": c.ATTR_WATERMARK_SECOND,
            "#c": c.ATTR_WATERMARK_CURSORS,
            "#t": c.ATTR_WATERMARK_TOKEN,
            "#l": c.ATTR_WATERMARK_LATE,
        }
        if new.reading is not None:
            update += ", #r = :reading"
            names["#r"] = c.ATTR_WATERMARK_READING
            values[":reading"] = {"N": str(new.reading)}
        if old is None:
            condition = "attribute_not_exists(pk)"
        elif old.token is not None and new.second == old.second:
            condition = "#t = :old"
            values[":old"] = {"S": old.token}
        else:
            condition = "#s = :old"
            values[":old"] = {"N": str(old.second)}
        try:
            self._call(
                "write watermark",
                lambda: self._client.update_item(
                    TableName=self._table,
                    Key=_WATERMARK_KEY,
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                ),
                deadline,
            )
        except StoreError as e:
            if condition_failed(e):
                was = "none" if old is None else old.second
                raise WatermarkConflictError(
                    f"watermark is no longer {was} as read: another writer changed it"
                ) from e.__cause__
            raise
        reading = new.reading if new.reading is not None else (old.reading if old else None)
        return Watermark(
            new.second, dict(new.cursors), values[":token"]["S"], reading, tuple(new.late)
        )

    def _call(self, operation: str, call: Callable[[], T], deadline: Deadline) -> T:
        try:
            return retry_call(operation, call, self._backoff, deadline)
        except AWS_ERRORS as e:
            raise StoreError(f"{operation}: {e}") from e
