"""Changes to moto's SQS and DynamoDB, applied once in the process hosting the embedded server.

They replace moto internals, so they are tied to one moto version (`WRITTEN_FOR`): `apply()`
refuses any other, and tests/integration/test_moto_fixes.py says, for each change, whether the
installed moto still needs it. After a moto upgrade: run that test, drop what moto now does
itself, check that the rest still holds, then set `WRITTEN_FOR`.

Speed, same behaviour: moto computes "now" through datetime arithmetic, and checks each received
message's retention by building all of the queue's attributes, three of which count the whole
queue. A receive of 10 messages from a queue holding 1,000 thus took close to a second, and the
emitter's latency and throughput followed. The replacements compute the same values directly.

Speed, same behaviour: moto answers a DynamoDB `Query` on a table's key by listing and sorting
every item of the table, then keeping those of the queried partition key, so each of the
scheduler's Query calls (one per shard and due-second) cost a sort of the whole table: with
20,000 messages stored, the scheduler read about one due-second per wall-clock second and fell
behind. The change hands that Query the queried partition's items only (sorted as before);
queries on an index and every other caller of the listing get the whole table, sorted as
before on the keys' values (21,000 items: 60 ms rather than 1.6 s on a busy 2-core machine).

Fidelity: DynamoDB applies each item write atomically, and conditional writes on one item one
after the other. moto's server answers requests on several threads, and its `UpdateItem` of a
missing item first stores the bare key, then checks nothing more and applies the update: a
concurrent `GetItem` saw the key without its attributes (the scheduler's progress item without
its second), and two conditional creates could interleave. Every DynamoDB item operation of
the backend now runs under one lock, as one step.

Fidelity: a DynamoDB `Scan` reads a table item by item and never holds up other requests.
Under that one lock a whole Scan page would (moto lists, sorts and copies every item of the
table for each page): the local TTL emulator's sweep of a table of 20,000 messages held every
other DynamoDB call, the emitters' cancel-marker reads and the scheduler's queries, for up to
seconds, every sweep. A Scan now takes the lock only to list the table and to copy or size
each item, so the other operations run between its items.

Fidelity: moto drops a FIFO message as a duplicate only while the first message with that
de-duplication id is still in the queue; SQS drops it for 5 minutes after the first was sent,
deleted or not. The wrapper keeps the ids for those 5 minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import version
from typing import Any, Final

from moto.core import utils as moto_utils
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models import dynamo_type
from moto.dynamodb.models import table as dynamodb_table
from moto.sqs import models as sqs_models

from delayq_local.exceptions import LocalStackError

WRITTEN_FOR: Final = "5.2.5"
DEDUPLICATION_WINDOW_MS: Final = 5 * 60 * 1000
_PRUNE_ABOVE: Final = 1000
_lock = threading.Lock()
_applied = False
# The table and partition key of the table-key Query running on this thread (moto's server
# answers requests on several threads; a Scan elsewhere must still see every item).
_querying = threading.local()


def _unix_time(dt: datetime | None = None) -> float:
    return time.time() if dt is None else moto_utils.unix_time(dt)


def _unix_time_millis(dt: datetime | None = None) -> float:
    return _unix_time(dt) * 1000.0


def _retained(backend: Any, queue_name: str, message: Any) -> bool:
    queue = backend.get_queue(queue_name)
    retain_until = int(queue.message_retention_period) + message.sent_timestamp / 1000
    return bool(retain_until > time.time())


def _deduplicating(add_message: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def add(queue: Any, message: Any) -> None:
        if queue.fifo_queue and message.deduplication_id:
            scope = message.group_id if queue.deduplication_scope == "messageGroup" else None
            key = (scope, message.deduplication_id)
            now = int(message.sent_timestamp)
            with _lock:
                seen: dict[tuple[str | None, str], int] = queue.__dict__.setdefault(
                    "_delayq_deduplication", {}
                )
                first = seen.get(key)
                if first is not None and now - first < DEDUPLICATION_WINDOW_MS:
                    return
                seen[key] = now
                if len(seen) > _PRUNE_ABOVE:
                    for old in [k for k, t in seen.items() if now - t >= DEDUPLICATION_WINDOW_MS]:
                        del seen[old]
        add_message(queue, message)

    return add


def _listing(table: Any) -> list[Any]:
    """``Table.all_items``: the table-key Query's partition only; any other listing (a Scan,
    an index Query) is taken under the item lock and sorted outside it, as moto sorts it."""
    if id(getattr(_querying, "table", None)) == id(table):
        found = table.items.get(_querying.hash_key)
        partitions = [] if found is None else [found]
        return sorted(_items(table, partitions), key=_item_order)
    with _dynamodb_lock:
        items = _items(table, list(table.items.values()))
    return sorted(items, key=_item_order)


def _items(table: Any, partitions: list[Any]) -> list[Any]:
    if not table.range_key_attr:
        return partitions
    return [item for partition in partitions for item in partition.values()]


def _item_order(item: Any) -> Any:
    """moto's order, on the keys' values: a DynamoType compares by its ``cast_value`` (and a
    key attribute has one type), so this sorts the same, comparing strings or numbers rather
    than calling DynamoType's comparisons in Python (most of a large table's listing time)."""
    if item.range_key:
        return (item.hash_key.cast_value, item.range_key.cast_value)
    return item.hash_key.cast_value


def _per_item(read: Callable[..., Any]) -> Callable[..., Any]:
    """An item read (copy, size) as one step against the item operations: a Scan outside the
    lock never sees an item half updated."""

    def locked(item: Any, *args: Any) -> Any:
        with _dynamodb_lock:
            return read(item, *args)

    locked.__qualname__ = f"_per_item.{read.__name__}"
    return locked


def _scoped_query(query: Callable[..., Any]) -> Callable[..., Any]:
    def scoped(table: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        # The 8th positional argument (or the keyword) is the index: an index query needs
        # every item, as moto lists them.
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name or hash_key is None:
            return query(table, hash_key, *args, **kwargs)
        _querying.table, _querying.hash_key = table, hash_key
        try:
            return query(table, hash_key, *args, **kwargs)
        finally:
            _querying.table = _querying.hash_key = None

    return scoped


# The DynamoDB backend's item operations, each made one atomic step (see the docstring).
# Not `scan`: it reads item by item (`_per_item`, `_listing`).
ATOMIC_DYNAMODB_OPERATIONS: Final = (
    "put_item",
    "get_item",
    "update_item",
    "delete_item",
    "query",
    "transact_write_items",
)
# What a Scan reads of each item, each under the item lock.
PER_ITEM_READS: Final = ("__deepcopy__", "size")
_dynamodb_lock = threading.RLock()


def _atomic(operation: Callable[..., Any]) -> Callable[..., Any]:
    def atomic(backend: Any, *args: Any, **kwargs: Any) -> Any:
        with _dynamodb_lock:
            return operation(backend, *args, **kwargs)

    atomic.__qualname__ = f"_atomic.{operation.__name__}"
    return atomic


def applied() -> bool:
    """Whether `apply()` has run in this process."""
    return _applied


def apply() -> None:
    """Install the changes (idempotent); fail loudly on another moto than `WRITTEN_FOR`, or if
    moto no longer has the originals."""
    global _applied  # noqa: PLW0603 (one process-wide switch)
    installed = version("moto")
    if installed != WRITTEN_FOR:
        raise LocalStackError(
            f"moto {installed} is installed; delayq_local.moto_fixes replaces SQS internals of "
            f"moto {WRITTEN_FOR}. Run tests/integration/test_moto_fixes.py to see which changes "
            "the new moto still needs, then update moto_fixes and its WRITTEN_FOR."
        )
    with _lock:
        if _applied:
            return
        backend, queue = sqs_models.SQSBackend, sqs_models.Queue
        originals: tuple[tuple[Any, str], ...] = (
            (sqs_models, "unix_time"),
            (sqs_models, "unix_time_millis"),
            (backend, "is_message_valid_based_on_retention_period"),
            (queue, "add_message"),
            (dynamodb_table.Table, "query"),
            (dynamodb_table.Table, "all_items"),
            *((dynamodb_models.DynamoDBBackend, n) for n in ATOMIC_DYNAMODB_OPERATIONS),
            *((dynamo_type.Item, n) for n in PER_ITEM_READS),
        )
        for owner, name in originals:
            if not callable(getattr(owner, name, None)):
                raise LocalStackError(f"moto changed: {owner.__name__}.{name} is gone")
        sqs_models.unix_time = _unix_time  # type: ignore[attr-defined]
        sqs_models.unix_time_millis = _unix_time_millis  # type: ignore[attr-defined]
        backend.is_message_valid_based_on_retention_period = _retained  # type: ignore[method-assign,assignment]
        queue.add_message = _deduplicating(queue.add_message)  # type: ignore[method-assign,assignment]
        table = dynamodb_table.Table
        table.query = _scoped_query(table.query)  # type: ignore[method-assign]
        table.all_items = _listing  # type: ignore[method-assign,assignment]
        for name in ATOMIC_DYNAMODB_OPERATIONS:
            dynamodb = dynamodb_models.DynamoDBBackend
            setattr(dynamodb, name, _atomic(getattr(dynamodb, name)))
        for name in PER_ITEM_READS:
            setattr(dynamo_type.Item, name, _per_item(getattr(dynamo_type.Item, name)))
        _applied = True
