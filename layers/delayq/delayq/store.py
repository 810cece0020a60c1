"""DynamoDB adapter: stored messages, cancel markers, the scheduler watermark, stats items.

One table, low-level client (typed attribute values), every batch call retried item by item.
"""

from __future__ import annotations

import base64
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from delayq import buckets
from delayq import constants as c
from delayq.contract import DelayRequest, headers_from_json, headers_json
from delayq.exceptions import StoreError, WatermarkConflictError
from delayq.retry import AWS_ERRORS, Backoff, Deadline, is_retryable, retry_call, retry_partial

Item = dict[str, Any]
T = TypeVar("T")


_WATERMARK_KEY: Item = {c.ATTR_PK: {"S": c.WATERMARK_PK}, c.ATTR_SK: {"S": c.WATERMARK_SK}}


@dataclass(frozen=True)
class Page:
    """One Query page of one partition (one shard of one due-second)."""

    pk: str
    messages: list[DelayRequest]
    # The sort key to read on after; None when the partition has nothing more.
    last_key: str | None


@dataclass(frozen=True)
class Watermark:
    """The scheduler's progress (one item, see :meth:`MessageStore.write_watermark`).

    Every message due up to ``second`` has been sent. ``cursors`` is the progress inside
    ``second + 1``: empty when it has not started; otherwise its unfinished partitions, each
    with the last sort key sent (partitions not listed are finished). ``token`` is renewed by
    every write (None for an item written before tokens existed, or not written yet).
    """

    second: int
    cursors: Mapping[str, str] = field(default_factory=dict)
    token: str | None = None


def message_item(request: DelayRequest, shards: int, ttl_grace_seconds: int) -> Item:
    """The stored form of a delay request (see docs/internals.md).

    Only what a reader needs is stored, so that a typical 1 KB message is one write unit:
    key and value are zlib-compressed when that makes them smaller (``key_z``, ``value_z``),
    ``src`` is left out when it equals the delay id, ``headers`` when there are none. ``size``
    stays uncompressed bytes (the reports count it). The ingest time is not stored: nothing
    read it.
    """
    second = buckets.due_second(request.due_ms)
    item: Item = {
        c.ATTR_PK: {"S": buckets.bucket_key(second, buckets.shard_of(request.delay_id, shards))},
        c.ATTR_SK: {"S": request.delay_id},
        "kind": {"S": c.KIND_MESSAGE},
        "due_ms": {"N": str(request.due_ms)},
        "target": {"S": request.target},
        "size": {"N": str(request.size)},
        c.ATTR_TTL: {"N": str(buckets.expires_at(request.due_ms, ttl_grace_seconds))},
    }
    if request.headers:
        item["headers"] = {"S": headers_json(request.headers)}
    if request.src != request.delay_id:
        item["src"] = {"S": request.src}
    if request.key is not None:
        item.update(_packed(c.ATTR_KEY, c.ATTR_KEY_Z, request.key))
    if request.value is not None:
        item.update(_packed(c.ATTR_VALUE, c.ATTR_VALUE_Z, request.value))
    if request.payload_ref:
        item["payload_ref"] = {"S": request.payload_ref}
    return item


def request_from_item(item: Item) -> DelayRequest:
    """Inverse of :func:`message_item`, for items of every version (earlier items have
    ``src``, ``headers`` and plain ``key`` / ``value`` always) and for stream images."""
    delay_id = item[c.ATTR_SK]["S"]
    return DelayRequest(
        delay_id=delay_id,
        target=item["target"]["S"],
        due_ms=int(item["due_ms"]["N"]),
        key=_unpacked(item, c.ATTR_KEY, c.ATTR_KEY_Z),
        value=_unpacked(item, c.ATTR_VALUE, c.ATTR_VALUE_Z),
        headers=headers_from_json(item["headers"]["S"]) if "headers" in item else (),
        src=item["src"]["S"] if "src" in item else delay_id,
        payload_ref=item.get("payload_ref", {}).get("S"),
    )


def _packed(plain: str, compressed: str, raw: bytes) -> Item:
    # zlib's default level: at 1 KB it costs ~1 us more than level 1 and saves ~10 B; on
    # larger values every KB saved is a write unit, worth far more than the CPU.
    packed = zlib.compress(raw, c.STORE_ZLIB_LEVEL)
    if len(compressed) + len(packed) < len(plain) + len(raw):
        return {compressed: {"B": packed}}
    return {plain: {"B": raw}}


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


def cancel_key(delay_id: str, shards: int) -> Item:
    """The key of a cancel marker."""
    return {
        c.ATTR_PK: {"S": f"{c.CANCEL_PK_PREFIX}{buckets.shard_of(delay_id, shards)}"},
        c.ATTR_SK: {"S": delay_id},
    }


def _chunks(items: Sequence[T], size: int) -> Iterable[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


class MessageStore:
    """The message table. Construct once per container; the client is injected."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        shards: int,
        ttl_grace_seconds: int,
        max_delay_seconds: int,
        backoff: Backoff | None = None,
        query_workers: int = 16,
    ) -> None:
        self._client = client
        self._table = table_name
        self._shards = shards
        self._ttl_grace = ttl_grace_seconds
        self._max_delay = max_delay_seconds
        self._backoff = backoff or Backoff()
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(query_workers, shards)))

    # --- writes --------------------------------------------------------------------------

    def put_messages(
        self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline
    ) -> None:
        """Store messages (TTL = due + grace). Same id and due twice is one item."""
        items = [message_item(r, self._shards, self._ttl_grace) for r in requests]
        self._batch_write("store messages", items, deadline)

    def put_cancels(self, delay_ids: Sequence[str], now_ms: int, deadline: Deadline) -> None:
        """Write cancel markers; they outlive any message they can cancel."""
        expires = now_ms // 1000 + self._max_delay + self._ttl_grace
        items = [
            {
                **cancel_key(i, self._shards),
                "kind": {"S": c.KIND_CANCEL},
                "cancelled_ms": {"N": str(now_ms)},
                c.ATTR_TTL: {"N": str(expires)},
            }
            for i in delay_ids
        ]
        self._batch_write("store cancel markers", items, deadline)

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

        TTL deletion runs late, so expired items may still be there: they are filtered out
        (a page may then hold fewer than ``limit`` messages and still have more after it).
        """
        now_s = now_ms // 1000
        return list(
            self._pool.map(lambda s: self._query_page(s[0], s[1], limit, now_s, deadline), starts)
        )

    def _query_page(
        self, pk: str, after: str | None, limit: int, now_s: int, deadline: Deadline
    ) -> Page:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "FilterExpression": "#ttl > :now",
            "ExpressionAttributeNames": {"#ttl": c.ATTR_TTL},
            "ExpressionAttributeValues": {":pk": {"S": pk}, ":now": {"N": str(now_s)}},
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

    def cancelled(self, delay_ids: Iterable[str], deadline: Deadline) -> set[str]:
        """The ids among ``delay_ids`` that have a cancel marker (BatchGetItem, 100 a call)."""
        wanted = sorted(set(delay_ids))
        found: set[str] = set()
        for chunk in _chunks(wanted, c.DYNAMODB_BATCH_GET_KEYS):
            keys = [cancel_key(i, self._shards) for i in chunk]

            def get(pending: list[Item]) -> list[Item]:
                response = self._call(
                    "read cancel markers",
                    lambda: self._client.batch_get_item(
                        RequestItems={self._table: {"Keys": pending, "ProjectionExpression": "sk"}}
                    ),
                    deadline,
                )
                found.update(i[c.ATTR_SK]["S"] for i in response["Responses"].get(self._table, []))
                return list(
                    response.get("UnprocessedKeys", {}).get(self._table, {}).get("Keys", [])
                )

            retry_partial("read cancel markers", get, keys, self._backoff, deadline)
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
        return Watermark(second, cursors, token)

    def get_watermark(self, deadline: Deadline) -> int | None:
        """The last due-second fully scheduled, or None before the first run."""
        mark = self.read_watermark(deadline)
        return None if mark is None else mark.second

    def advance_watermark(
        self, old: int | None, new: int, now_ms: int, deadline: Deadline
    ) -> Watermark:
        """Move the watermark from ``old`` to ``new`` (no progress inside ``new + 1``) only if
        nobody else moved it first."""
        return self.write_watermark(
            None if old is None else Watermark(old), Watermark(new), now_ms, deadline
        )

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

        Raises :class:`WatermarkConflictError` when the condition fails.
        """
        values: Item = {
            ":second": {"N": str(new.second)},
            ":cursors": {"M": {pk: {"S": sk} for pk, sk in new.cursors.items()}},
            ":token": {"S": uuid.uuid4().hex},
            ":now": {"N": str(now_ms)},
            ":kind": {"S": c.KIND_WATERMARK},
        }
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
                    UpdateExpression=(
                        "SET #s = :second, #c = :cursors, #t = :token, updated_ms = :now,"
                        " kind = :kind"
                    ),
                    ConditionExpression=condition,
                    ExpressionAttributeNames={
                        "#s": c.ATTR_WATERMARK_SECOND,
                        "#c": c.ATTR_WATERMARK_CURSORS,
                        "#t": c.ATTR_WATERMARK_TOKEN,
                    },
                    ExpressionAttributeValues=values,
                ),
                deadline,
            )
        except StoreError as e:
            if isinstance(e.__cause__, ClientError) and (
                e.__cause__.response["Error"]["Code"] == "ConditionalCheckFailedException"
            ):
                was = "none" if old is None else old.second
                raise WatermarkConflictError(
                    f"watermark is no longer {was} as read: another scheduler wrote it"
                ) from e.__cause__
            raise
        return Watermark(new.second, dict(new.cursors), values[":token"]["S"])

    def _call(self, operation: str, call: Callable[[], T], deadline: Deadline) -> T:
        try:
            return retry_call(operation, call, self._backoff, deadline)
        except AWS_ERRORS as e:
            raise StoreError(f"{operation}: {e}") from e
