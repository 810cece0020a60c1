"""DynamoDB adapter: stored messages, cancel markers, the scheduler watermark, stats items.

One table, low-level client (typed attribute values), every batch call retried item by item.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from delayq import buckets
from delayq import constants as c
from delayq.contract import DelayRequest, headers_from_json, headers_json
from delayq.exceptions import StoreError, WatermarkConflictError
from delayq.retry import Backoff, Deadline, is_retryable, retry_call, retry_partial

Item = dict[str, Any]
T = TypeVar("T")


def message_item(request: DelayRequest, shards: int, ttl_grace_seconds: int, now_ms: int) -> Item:
    """The stored form of a delay request (see docs/internals.md)."""
    second = buckets.due_second(request.due_ms)
    item: Item = {
        c.ATTR_PK: {"S": buckets.bucket_key(second, buckets.shard_of(request.delay_id, shards))},
        c.ATTR_SK: {"S": request.delay_id},
        "kind": {"S": c.KIND_MESSAGE},
        "due_ms": {"N": str(request.due_ms)},
        "target": {"S": request.target},
        "headers": {"S": headers_json(request.headers)},
        "src": {"S": request.src},
        "size": {"N": str(request.size)},
        "ingested_ms": {"N": str(now_ms)},
        c.ATTR_TTL: {"N": str(buckets.expires_at(request.due_ms, ttl_grace_seconds))},
    }
    if request.key is not None:
        item["key"] = {"B": request.key}
    if request.value is not None:
        item["value"] = {"B": request.value}
    if request.payload_ref:
        item["payload_ref"] = {"S": request.payload_ref}
    return item


def request_from_item(item: Item) -> DelayRequest:
    """Inverse of :func:`message_item` (also for stream images)."""
    return DelayRequest(
        delay_id=item[c.ATTR_SK]["S"],
        target=item["target"]["S"],
        due_ms=int(item["due_ms"]["N"]),
        key=_binary(item.get("key")),
        value=_binary(item.get("value")),
        headers=headers_from_json(item["headers"]["S"]),
        src=item["src"]["S"],
        payload_ref=item.get("payload_ref", {}).get("S"),
    )


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
        items = [message_item(r, self._shards, self._ttl_grace, now_ms) for r in requests]
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
        except ClientError as e:
            if is_retryable(e):
                raise
            raise StoreError(f"BatchWriteItem failed: {e}") from e
        unprocessed = response.get("UnprocessedItems", {}).get(self._table, [])
        return [u["PutRequest"]["Item"] for u in unprocessed]

    # --- reads ---------------------------------------------------------------------------

    def query_seconds(
        self, seconds: Sequence[int], now_ms: int, deadline: Deadline
    ) -> dict[int, list[DelayRequest]]:
        """Every live message due in each of ``seconds``: all shards of all the seconds are
        queried in parallel (one partition per call), results grouped by second.

        TTL deletion runs late, so expired items may still be there: they are filtered out.
        """
        now_s = now_ms // 1000
        keys = [
            (second, key) for second in seconds for key in buckets.bucket_keys(second, self._shards)
        ]
        parts = self._pool.map(lambda sk: self._query_partition(sk[1], now_s, deadline), keys)
        grouped: dict[int, list[DelayRequest]] = {second: [] for second in seconds}
        for (second, _), found in zip(keys, parts, strict=True):
            grouped[second].extend(found)
        return grouped

    def _query_partition(self, pk: str, now_s: int, deadline: Deadline) -> list[DelayRequest]:
        out: list[DelayRequest] = []
        start: Item | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "KeyConditionExpression": "pk = :pk",
                "FilterExpression": "#ttl > :now",
                "ExpressionAttributeNames": {"#ttl": c.ATTR_TTL},
                "ExpressionAttributeValues": {":pk": {"S": pk}, ":now": {"N": str(now_s)}},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            page = self._call("query due-second", partial(self._client.query, **kwargs), deadline)
            out.extend(request_from_item(i) for i in page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                return out

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

    def get_watermark(self, deadline: Deadline) -> int | None:
        """The last due-second fully scheduled, or None before the first run."""
        response = self._call(
            "read watermark",
            lambda: self._client.get_item(
                TableName=self._table,
                Key={c.ATTR_PK: {"S": c.WATERMARK_PK}, c.ATTR_SK: {"S": c.WATERMARK_SK}},
                ConsistentRead=True,
            ),
            deadline,
        )
        item = response.get("Item")
        return int(item["second"]["N"]) if item else None

    def advance_watermark(self, old: int | None, new: int, now_ms: int, deadline: Deadline) -> None:
        """Move the watermark from ``old`` to ``new`` only if nobody else moved it first."""
        condition = "attribute_not_exists(pk)" if old is None else "#s = :old"
        values: Item = {
            ":new": {"N": str(new)},
            ":now": {"N": str(now_ms)},
            ":kind": {"S": c.KIND_WATERMARK},
        }
        if old is not None:
            values[":old"] = {"N": str(old)}
        try:
            self._call(
                "advance watermark",
                lambda: self._client.update_item(
                    TableName=self._table,
                    Key={c.ATTR_PK: {"S": c.WATERMARK_PK}, c.ATTR_SK: {"S": c.WATERMARK_SK}},
                    UpdateExpression="SET #s = :new, updated_ms = :now, kind = :kind",
                    ConditionExpression=condition,
                    ExpressionAttributeNames={"#s": "second"},
                    ExpressionAttributeValues=values,
                ),
                deadline,
            )
        except StoreError as e:
            if isinstance(e.__cause__, ClientError) and (
                e.__cause__.response["Error"]["Code"] == "ConditionalCheckFailedException"
            ):
                raise WatermarkConflictError(
                    f"watermark is no longer {old}: another scheduler advanced it"
                ) from e.__cause__
            raise

    def _call(self, operation: str, call: Callable[[], T], deadline: Deadline) -> T:
        try:
            return retry_call(operation, call, self._backoff, deadline)
        except ClientError as e:
            raise StoreError(f"{operation}: {e}") from e
