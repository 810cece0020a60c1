"""In-memory stand-ins for the AWS clients the adapters call (the Kafka producer is in
:mod:`testkit.kafka`).

They answer the calls the layer's adapters make (``delayq.store``, ``delayq.queues``,
``delayq.payloads``) with the shapes and errors of the low-level boto3 clients, at a small
fraction of moto's cost, so that a benchmark measures the handler and not
the emulator. ``tests/unit/test_testkit_aws.py`` compares them with moto call by call.

Every fake counts its calls by API name (``calls``) and the billing units they consume
(``units``: DynamoDB read/write request units, SQS 64 KB request chunks, S3 requests) in a
:class:`RequestCounter`, which several fakes may share. No botocore event machinery is
involved; botocore is imported only for :class:`~botocore.exceptions.ClientError`, which the
adapters catch.

Deliberate limits: the expression parsers accept the forms the adapters use (``pk = :pk``,
one comparison as a filter or condition, ``attribute_(not_)exists``, ``SET a = :x, ...``)
and raise :class:`NotImplementedError` on anything else, so that an adapter change shows up
loudly instead of being answered wrongly. Items handed out are the stored dictionaries (not
copies): callers must not mutate them (the adapters do not). TTL never expires anything (as
in moto): readers filter expired items themselves.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math
import re
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, cast

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

Item = dict[str, Any]
MsClock = Callable[[], int]

KB: Final = 1024
WRITE_UNIT_BYTES: Final = 1024
READ_UNIT_BYTES: Final = 4096
QUERY_PAGE_BYTES: Final = 1024 * 1024
SQS_CHUNK_BYTES: Final = 64 * 1024
SQS_MAX_BATCH_ENTRIES: Final = 10
SQS_MAX_BATCH_BYTES: Final = 1024 * 1024  # the payload limit since 2025 (the layer keeps 256 KiB)
SQS_MAX_DELAY_SECONDS: Final = 900
FIFO_DEDUP_MS: Final = 5 * 60 * 1000
DDB_MAX_BATCH_WRITE: Final = 25
DDB_MAX_BATCH_GET: Final = 100


def _error(operation: str, code: str, message: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


# --- the client types ----------------------------------------------------------------------
#
# The layer's adapters take the boto3 client types of the ``mypy_boto3_*`` stubs. The fakes
# below, and the wrappers built around a client (``tests.factories.ClientProxy`` and
# ``RecordingSqs``, ``sim.faults.Faulty``, ``sim.aws.ReplicatedDynamoDB``,
# ``bench.burst.LatencyClient``, the test doubles that answer one call), implement only the
# subset of the low-level API that the layer calls, with the same keyword arguments, response
# shapes and errors (``tests/unit/test_testkit_aws.py`` compares the fakes with moto). These
# three functions are the one place that tells the type checker so: hand a stand-in to an
# adapter through them. At run time they return their argument unchanged.


def as_dynamodb_client(stand_in: object) -> DynamoDBClient:
    """``stand_in`` (a fake or wrapper answering the layer's DynamoDB calls) as a client."""
    return cast("DynamoDBClient", stand_in)


def as_sqs_client(stand_in: object) -> SQSClient:
    """``stand_in`` (a fake or wrapper answering the layer's SQS calls) as a client."""
    return cast("SQSClient", stand_in)


def as_s3_client(stand_in: object) -> S3Client:
    """``stand_in`` (a fake or wrapper answering the layer's S3 calls) as a client."""
    return cast("S3Client", stand_in)


# --- counting ------------------------------------------------------------------------------


@dataclass
class RequestCounter:
    """API calls by ``(service, operation)`` and billing units by ``(service, unit)``.

    Units: ``dynamodb``: ``wru`` / ``rru`` (on-demand request units); ``sqs``: ``standard`` /
    ``fifo`` (billed requests: one per started 64 KB of payload); ``s3``: ``put`` / ``get`` /
    ``delete`` (requests); ``kafka``: ``records``.
    """

    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    units: Counter[tuple[str, str]] = field(default_factory=Counter)

    def record(self, service: str, operation: str, **units: float) -> None:
        """Count one call and the units it consumed."""
        self.calls[(service, operation)] += 1
        for name, value in units.items():
            self.units[(service, name)] += value  # type: ignore[assignment]

    def snapshot(self) -> RequestCounter:
        """A frozen copy (subtract two snapshots to count what happened in between)."""
        return RequestCounter(Counter(self.calls), Counter(self.units))

    def since(self, before: RequestCounter) -> RequestCounter:
        """What was counted after ``before`` was taken."""
        calls = Counter(self.calls)
        calls.subtract(before.calls)
        units = Counter(self.units)
        units.subtract(before.units)
        return RequestCounter(+calls, Counter({k: v for k, v in units.items() if v}))

    def reset(self) -> None:
        """Forget everything counted so far."""
        self.calls.clear()
        self.units.clear()

    def service_calls(self, service: str) -> int:
        """Calls to one service."""
        return sum(n for (s, _), n in self.calls.items() if s == service)

    def unit(self, service: str, name: str) -> float:
        """One unit total."""
        return float(self.units.get((service, name), 0))

    def by_operation(self) -> dict[str, int]:
        """``{"service.Operation": calls}``, sorted."""
        return {f"{s}.{o}": n for (s, o), n in sorted(self.calls.items())}


# --- DynamoDB ------------------------------------------------------------------------------


def _number_size(raw: str) -> int:
    if raw.isdigit():  # the common case: a whole number >= 0
        digits = raw.strip("0") or "0"
    else:
        digits = raw.lstrip("-+").replace(".", "").lstrip("0").rstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


_SIZE_OF: Final[dict[str, Callable[[Any], int]]] = {
    "S": lambda raw: len(raw) if raw.isascii() else len(raw.encode()),
    "N": _number_size,
    "B": len,
    "BOOL": lambda _: 1,
    "NULL": lambda _: 1,
    "SS": lambda raw: sum(len(s.encode()) for s in raw),
    "NS": lambda raw: sum(_number_size(n) for n in raw),
    "BS": lambda raw: sum(len(b) for b in raw),
    "L": lambda raw: 3 + sum(1 + attribute_size(v) for v in raw),
    "M": lambda raw: 3 + sum(1 + len(k.encode()) + attribute_size(v) for k, v in raw.items()),
}


def attribute_size(value: Mapping[str, Any]) -> int:
    """Bytes of one typed attribute value, by DynamoDB's item-size rules."""
    ((kind, raw),) = value.items()
    size_of = _SIZE_OF.get(kind)
    if size_of is None:
        raise NotImplementedError(f"attribute type {kind}")
    return size_of(raw)


def item_size(item: Mapping[str, Any]) -> int:
    """Bytes of an item: attribute names plus values (what capacity units are computed on).

    The common types are sized inline: the benchmarks time handlers on these clients, and
    what AWS computes server-side should cost the handler's figures as little as possible."""
    names = "".join(item)
    total = len(names) if names.isascii() else len(names.encode())
    for value in item.values():
        ((kind, raw),) = value.items()
        if kind == "B":
            total += len(raw)
        elif kind == "S":
            total += len(raw) if raw.isascii() else len(raw.encode())
        elif kind == "N":
            total += _number_size(raw)
        else:
            total += attribute_size(value)
    return total


def write_units(size: int) -> int:
    """Write request units of one item write (1 KB each, rounded up, at least 1)."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def read_units(size: int, consistent: bool) -> float:
    """Read request units of one item read (4 KB each, rounded up, at least 1; eventually
    consistent reads cost half). A read of a missing item costs the same as a small one."""
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


_NAME = r"#?[A-Za-z_][A-Za-z0-9_.]*"
_KEY_CONDITION = re.compile(rf"^\s*({_NAME})\s*=\s*(:\w+)\s*$")
_ADD_CLAUSE = re.compile(rf"^\s*({_NAME})\s+(:\w+)\s*$")
_UPDATE_SECTION = re.compile(r"\b(SET|ADD)\s+", re.IGNORECASE)
_SET_CLAUSE = re.compile(rf"^\s*({_NAME})\s*=\s*(:\w+)\s*$")
# ``a = if_not_exists(b, :x)``: b as the item was before the update, else :x.
_SET_IF_NOT_EXISTS = re.compile(
    rf"^\s*({_NAME})\s*=\s*if_not_exists\s*\(\s*({_NAME})\s*,\s*(:\w+)\s*\)\s*$"
)
# Commas that separate clauses (not those inside a function's parentheses).
_CLAUSE_COMMA = re.compile(r",(?![^(]*\))")


def _comparable(value: Mapping[str, Any]) -> tuple[str, Any]:
    ((kind, raw),) = value.items()
    if kind == "N":
        return kind, Decimal(raw)
    if kind == "S":
        return kind, raw.encode()
    if kind == "B":
        return kind, bytes(raw)
    return kind, raw


def _compare(left: Mapping[str, Any] | None, op: str, right: Mapping[str, Any]) -> bool:
    if left is None:
        return op == "<>"
    lkind, lval = _comparable(left)
    rkind, rval = _comparable(right)
    if lkind != rkind:
        return op == "<>"
    result: bool
    if op == "=":
        result = lval == rval
    elif op == "<>":
        result = lval != rval
    elif op == "<":
        result = lval < rval
    elif op == "<=":
        result = lval <= rval
    elif op == ">":
        result = lval > rval
    else:
        result = lval >= rval
    return result


def _update_clauses(expression: str) -> list[tuple[str, str]]:
    """``(SET or ADD, clause)`` of every clause of an update expression."""
    parts = _UPDATE_SECTION.split(expression.strip())
    if parts[0].strip() or len(parts) < 3:
        raise NotImplementedError(f"update expression not supported: {expression!r}")
    return [
        (action.upper(), clause)
        for action, body in zip(parts[1::2], parts[2::2], strict=True)
        for clause in _CLAUSE_COMMA.split(body)
    ]


@dataclass
class _Expression:
    """Names and values of one request's expressions."""

    names: Mapping[str, str]
    values: Mapping[str, Any]
    operation: str

    def name(self, token: str) -> str:
        if token.startswith("#"):
            try:
                return self.names[token]
            except KeyError as e:
                raise _error(
                    self.operation, "ValidationException", f"undefined name {token}"
                ) from e
        return token

    def value(self, token: str) -> Any:
        try:
            return self.values[token]
        except KeyError as e:
            raise _error(self.operation, "ValidationException", f"undefined value {token}") from e

    def condition(self, text: str, item: Mapping[str, Any] | None) -> bool:
        """Evaluate a condition: comparisons, ``attribute_exists``, ``attribute_not_exists``
        and ``begins_with``, joined by AND, OR and NOT, with parentheses."""
        tokens = [t for t in _TOKEN.findall(text) if t.strip()]
        if "".join(tokens) != "".join(text.split()):
            raise NotImplementedError(f"expression not supported by the fake: {text!r}")
        parser = _ConditionParser(tokens, self, item)
        result = parser.disjunction()
        if parser.position != len(tokens):
            raise NotImplementedError(f"expression not supported by the fake: {text!r}")
        return result

    def projection(self, text: str) -> list[str]:
        return [self.name(part.strip()) for part in text.split(",") if part.strip()]


_TOKEN = re.compile(r"\s*(\(|\)|,|<>|<=|>=|=|<|>|[#:]?[A-Za-z_][A-Za-z0-9_.]*)")
_FUNCTIONS = ("attribute_exists", "attribute_not_exists", "begins_with")


class _ConditionParser:
    """Recursive descent over a condition's tokens (OR binds loosest, then AND, then NOT)."""

    def __init__(
        self, tokens: list[str], expr: _Expression, item: Mapping[str, Any] | None
    ) -> None:
        self.tokens = tokens
        self.position = 0
        self._expr = expr
        self._item = item

    def _peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if not token or (expected is not None and token.upper() != expected):
            raise NotImplementedError(f"expression not supported by the fake: {self.tokens!r}")
        self.position += 1
        return token

    def disjunction(self) -> bool:
        results = [self._conjunction()]
        while self._peek().upper() == "OR":
            self._take()
            results.append(self._conjunction())
        return any(results)

    def _conjunction(self) -> bool:
        results = [self._unary()]
        while self._peek().upper() == "AND":
            self._take()
            results.append(self._unary())
        return all(results)

    def _unary(self) -> bool:
        if self._peek().upper() == "NOT":
            self._take()
            return not self._unary()
        if self._peek() == "(":
            self._take()
            result = self.disjunction()
            self._take(")")
            return result
        first = self._take()
        if first in _FUNCTIONS:
            return self._function(first)
        op = self._take()
        if op not in {"=", "<>", "<", "<=", ">", ">="}:
            raise NotImplementedError(f"expression not supported by the fake: {self.tokens!r}")
        return _compare(self._attribute(first), op, self._expr.value(self._take()))

    def _function(self, name: str) -> bool:
        self._take("(")
        attribute = self._attribute(self._take())
        if name == "begins_with":
            self._take(",")
            prefix = self._expr.value(self._take())
            self._take(")")
            return attribute is not None and _comparable(attribute)[1].startswith(
                _comparable(prefix)[1]
            )
        self._take(")")
        present = attribute is not None
        return present if name == "attribute_exists" else not present

    def _attribute(self, token: str) -> Any:
        return None if self._item is None else self._item.get(self._expr.name(token))


@dataclass
class _Stored:
    item: Item
    size: int


@dataclass
class _Partition:
    rows: dict[str, _Stored] = field(default_factory=dict)
    _order: list[str] | None = None

    def put(self, sk: str, stored: _Stored) -> None:
        if sk not in self.rows:
            self._order = None
        self.rows[sk] = stored

    def delete(self, sk: str) -> _Stored | None:
        stored = self.rows.pop(sk, None)
        if stored is not None:
            self._order = None
        return stored

    def ordered(self) -> list[str]:
        if self._order is None:
            self._order = sorted(self.rows, key=str.encode)
        return self._order


# What UpdateItem can return here (``UPDATED_OLD`` and ``ALL_OLD`` are not modelled).
_RETURN_VALUES: Final = frozenset({"NONE", "UPDATED_NEW", "ALL_NEW"})


class FakeDynamoDB:
    """A low-level DynamoDB client for tables keyed by string ``pk`` (hash) and ``sk``
    (range): the calls ``delayq.store.MessageStore`` makes, plus ``delete_item``."""

    service = "dynamodb"

    def __init__(
        self,
        counter: RequestCounter | None = None,
        *,
        hash_key: str = "pk",
        range_key: str = "sk",
    ) -> None:
        self.counter = counter or RequestCounter()
        self.hash_key = hash_key
        self.range_key = range_key
        self._tables: dict[str, dict[str, _Partition]] = {}

    # Administration (not API-shaped) -------------------------------------------------------

    def create_table(self, name: str) -> None:
        """Create an empty table (idempotent)."""
        self._tables.setdefault(name, {})

    def item_count(self, name: str) -> int:
        """Items stored in a table."""
        return sum(len(p.rows) for p in self._table(name, "DescribeTable").values())

    def items(self, name: str) -> list[Item]:
        """Every stored item (for tests and reports)."""
        return [s.item for p in self._table(name, "Scan").values() for s in p.rows.values()]

    # Helpers -----------------------------------------------------------------------------

    def _table(self, name: str, operation: str) -> dict[str, _Partition]:
        table = self._tables.get(name)
        if table is None:
            raise _error(operation, "ResourceNotFoundException", "Requested resource not found")
        return table

    def _key(self, key: Mapping[str, Any], operation: str) -> tuple[str, str]:
        try:
            return key[self.hash_key]["S"], key[self.range_key]["S"]
        except (KeyError, TypeError) as e:
            raise _error(
                operation,
                "ValidationException",
                "The provided key element does not match the schema",
            ) from e

    def _get(self, table: dict[str, _Partition], pk: str, sk: str) -> _Stored | None:
        partition = table.get(pk)
        return None if partition is None else partition.rows.get(sk)

    def _put(self, table: dict[str, _Partition], item: Item, operation: str) -> float:
        pk, sk = self._key(item, operation)
        stored = _Stored(dict(item), item_size(item))
        partition = table.get(pk)
        if partition is None:
            partition = table[pk] = _Partition()
        old = partition.rows.get(sk)
        partition.put(sk, stored)
        return write_units(max(stored.size, old.size if old else 0))

    def _delete(self, table: dict[str, _Partition], key: Mapping[str, Any], op: str) -> float:
        pk, sk = self._key(key, op)
        partition = table.get(pk)
        old = partition.delete(sk) if partition else None
        return write_units(old.size if old else 0)

    # API ---------------------------------------------------------------------------------

    def batch_write_item(self, *, RequestItems: Mapping[str, Sequence[Any]]) -> dict[str, Any]:  # noqa: N803
        """Puts and deletes, at most 25 requests, no key twice; never leaves items unprocessed."""
        operation = "BatchWriteItem"
        total = sum(len(requests) for requests in RequestItems.values())
        if total > DDB_MAX_BATCH_WRITE or total == 0:
            raise _error(
                operation,
                "ValidationException",
                "Too many items requested for the BatchWriteItem call"
                if total
                else "The batch write request list is empty",
            )
        units = 0.0
        for name, requests in RequestItems.items():
            table = self._table(name, operation)
            keys = []
            for request in requests:
                body = request.get("PutRequest", {}).get("Item") or request.get(
                    "DeleteRequest", {}
                ).get("Key")
                keys.append(self._key(body or {}, operation))
            if len(set(keys)) != len(keys):
                raise _error(
                    operation,
                    "ValidationException",
                    "Provided list of item keys contains duplicates",
                )
            for request in requests:
                if "PutRequest" in request:
                    units += self._put(table, request["PutRequest"]["Item"], operation)
                else:
                    units += self._delete(table, request["DeleteRequest"]["Key"], operation)
        self.counter.record(self.service, operation, wru=units)
        return {"UnprocessedItems": {}}

    def put_item(
        self,
        *,
        TableName: str,  # noqa: N803
        Item: Item,  # noqa: N803
        ConditionExpression: str | None = None,  # noqa: N803
        ExpressionAttributeNames: Mapping[str, str] | None = None,  # noqa: N803
        ExpressionAttributeValues: Mapping[str, Any] | None = None,  # noqa: N803
    ) -> dict[str, Any]:
        """Write one item, optionally under a condition on the item it replaces."""
        operation = "PutItem"
        table = self._table(TableName, operation)
        if ConditionExpression:
            pk, sk = self._key(Item, operation)
            old = self._get(table, pk, sk)
            expr = _Expression(
                ExpressionAttributeNames or {}, ExpressionAttributeValues or {}, operation
            )
            if not expr.condition(ConditionExpression, old.item if old else None):
                self.counter.record(self.service, operation, wru=write_units(item_size(Item)))
                raise _error(
                    operation, "ConditionalCheckFailedException", "The conditional request failed"
                )
        units = self._put(table, Item, operation)
        self.counter.record(self.service, operation, wru=units)
        return {}

    def delete_item(self, *, TableName: str, Key: Mapping[str, Any]) -> dict[str, Any]:  # noqa: N803
        """Delete one item (a missing item is fine)."""
        operation = "DeleteItem"
        units = self._delete(self._table(TableName, operation), Key, operation)
        self.counter.record(self.service, operation, wru=units)
        return {}

    def get_item(
        self,
        *,
        TableName: str,  # noqa: N803
        Key: Mapping[str, Any],  # noqa: N803
        ConsistentRead: bool = False,  # noqa: N803
        ProjectionExpression: str | None = None,  # noqa: N803
        ExpressionAttributeNames: Mapping[str, str] | None = None,  # noqa: N803
    ) -> dict[str, Any]:
        """One item by key, or no ``Item`` at all."""
        operation = "GetItem"
        pk, sk = self._key(Key, operation)
        stored = self._get(self._table(TableName, operation), pk, sk)
        self.counter.record(
            self.service, operation, rru=read_units(stored.size if stored else 0, ConsistentRead)
        )
        if stored is None:
            return {}
        item = stored.item
        if ProjectionExpression:
            names = _Expression(ExpressionAttributeNames or {}, {}, operation).projection(
                ProjectionExpression
            )
            item = {n: item[n] for n in names if n in item}
        return {"Item": item}

    def batch_get_item(self, *, RequestItems: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:  # noqa: N803
        """Up to 100 keys; each costs what a GetItem of it costs. Never leaves keys unprocessed."""
        operation = "BatchGetItem"
        total = sum(len(spec.get("Keys", [])) for spec in RequestItems.values())
        if total > DDB_MAX_BATCH_GET:
            raise _error(
                operation,
                "ValidationException",
                "Too many items requested for the BatchGetItem call",
            )
        responses: dict[str, list[Item]] = {}
        units = 0.0
        for name, spec in RequestItems.items():
            table = self._table(name, operation)
            consistent = bool(spec.get("ConsistentRead", False))
            expr = _Expression(spec.get("ExpressionAttributeNames") or {}, {}, operation)
            projection = spec.get("ProjectionExpression")
            names = expr.projection(projection) if projection else None
            found: list[Item] = []
            keys = [self._key(k, operation) for k in spec.get("Keys", [])]
            if len(set(keys)) != len(keys):
                raise _error(
                    operation,
                    "ValidationException",
                    "Provided list of item keys contains duplicates",
                )
            for pk, sk in keys:
                stored = self._get(table, pk, sk)
                units += read_units(stored.size if stored else 0, consistent)
                if stored is not None:
                    item = stored.item
                    found.append({n: item[n] for n in names if n in item} if names else item)
            responses[name] = found
        self.counter.record(self.service, operation, rru=units)
        return {"Responses": responses, "UnprocessedKeys": {}}

    def query(
        self,
        *,
        TableName: str,  # noqa: N803
        KeyConditionExpression: str,  # noqa: N803
        ExpressionAttributeValues: Mapping[str, Any],  # noqa: N803
        ExpressionAttributeNames: Mapping[str, str] | None = None,  # noqa: N803
        FilterExpression: str | None = None,  # noqa: N803
        ExclusiveStartKey: Mapping[str, Any] | None = None,  # noqa: N803
        Limit: int | None = None,  # noqa: N803
        ConsistentRead: bool = False,  # noqa: N803
    ) -> dict[str, Any]:
        """Items of one partition in sort-key order, 1 MB (read before the filter) a page."""
        operation = "Query"
        table = self._table(TableName, operation)
        expr = _Expression(ExpressionAttributeNames or {}, ExpressionAttributeValues, operation)
        hash_part, _, range_part = KeyConditionExpression.partition(" AND ")
        match = _KEY_CONDITION.match(hash_part)
        if not match or expr.name(match.group(1)) != self.hash_key:
            raise NotImplementedError(f"key condition not supported: {KeyConditionExpression!r}")
        pk_value = expr.value(match.group(2))
        partition = table.get(pk_value["S"])
        order = partition.ordered() if partition else []
        start = 0
        if ExclusiveStartKey:
            last = self._key(ExclusiveStartKey, operation)[1].encode()
            start = next((i for i, sk in enumerate(order) if sk.encode() > last), len(order))
        items: list[Item] = []
        scanned = 0
        read_bytes = 0
        last_key: dict[str, Any] | None = None
        for index in range(start, len(order)):
            assert partition is not None
            stored = partition.rows[order[index]]
            if range_part and not expr.condition(range_part, stored.item):
                continue  # outside the key condition: not read, not billed
            scanned += 1
            read_bytes += stored.size
            if FilterExpression is None or expr.condition(FilterExpression, stored.item):
                items.append(stored.item)
            more = index + 1 < len(order)
            if more and (read_bytes >= QUERY_PAGE_BYTES or (Limit and scanned >= Limit)):
                last_key = {
                    self.hash_key: stored.item[self.hash_key],
                    self.range_key: stored.item[self.range_key],
                }
                break
        self.counter.record(self.service, operation, rru=read_units(read_bytes, ConsistentRead))
        response: dict[str, Any] = {"Items": items, "Count": len(items), "ScannedCount": scanned}
        if last_key is not None:
            response["LastEvaluatedKey"] = last_key
        return response

    def update_item(
        self,
        *,
        TableName: str,  # noqa: N803
        Key: Mapping[str, Any],  # noqa: N803
        UpdateExpression: str,  # noqa: N803
        ConditionExpression: str | None = None,  # noqa: N803
        ExpressionAttributeNames: Mapping[str, str] | None = None,  # noqa: N803
        ExpressionAttributeValues: Mapping[str, Any] | None = None,  # noqa: N803
        ReturnValues: str = "NONE",  # noqa: N803
    ) -> dict[str, Any]:
        """``SET a = :x, b = if_not_exists(c, :y)`` and ``ADD n :k`` (numbers, created at 0)
        on one item
        (created if missing), under an optional condition. ``ReturnValues``: ``NONE``,
        ``UPDATED_NEW`` (the attributes the update wrote, as written) or ``ALL_NEW``."""
        operation = "UpdateItem"
        if ReturnValues not in _RETURN_VALUES:
            raise NotImplementedError(f"ReturnValues={ReturnValues!r} not supported")
        table = self._table(TableName, operation)
        pk, sk = self._key(Key, operation)
        expr = _Expression(
            ExpressionAttributeNames or {}, ExpressionAttributeValues or {}, operation
        )
        old = self._get(table, pk, sk)
        new = dict(old.item) if old else dict(Key)
        updated: dict[str, Any] = {}
        for action, clause in _update_clauses(UpdateExpression):
            fallback = _SET_IF_NOT_EXISTS.match(clause) if action == "SET" else None
            if fallback:
                name = expr.name(fallback.group(1))
                present = old.item.get(expr.name(fallback.group(2))) if old else None
                value = present if present is not None else expr.value(fallback.group(3))
                new[name] = value
                updated[name] = value
                continue
            pattern = _SET_CLAUSE if action == "SET" else _ADD_CLAUSE
            match = pattern.match(clause)
            if not match:
                raise NotImplementedError(f"update clause not supported: {clause!r}")
            name, value = expr.name(match.group(1)), expr.value(match.group(2))
            if action == "ADD":
                total = Decimal(new.get(name, {"N": "0"})["N"]) + Decimal(value["N"])
                value = {"N": str(total)}
            new[name] = value
            updated[name] = value
        units = write_units(max(item_size(new), old.size if old else 0))
        if ConditionExpression and not expr.condition(
            ConditionExpression, old.item if old else None
        ):
            self.counter.record(self.service, operation, wru=units)
            raise _error(
                operation, "ConditionalCheckFailedException", "The conditional request failed"
            )
        table.setdefault(pk, _Partition()).put(sk, _Stored(new, item_size(new)))
        self.counter.record(self.service, operation, wru=units)
        returned = {"UPDATED_NEW": updated, "ALL_NEW": new}.get(ReturnValues)
        return {} if returned is None else {"Attributes": copy.deepcopy(returned)}

    def transact_write_items(self, *, TransactItems: Sequence[Mapping[str, Any]]) -> dict[str, Any]:  # noqa: N803
        """``ConditionCheck``, ``Update`` and ``Put`` items, all or none: every condition is
        judged first; when one fails, ``TransactionCanceledException`` with a reason per item
        (``ConditionalCheckFailed`` or ``None``), as DynamoDB answers. Two write units per KB
        of each item (condition checks included)."""
        operation = "TransactWriteItems"
        reasons: list[dict[str, str]] = []
        units = 0
        for entry in TransactItems:
            ((kind, body),) = entry.items()
            if kind not in ("ConditionCheck", "Update", "Put"):
                raise NotImplementedError(f"transaction item {kind!r} not supported")
            table = self._table(body["TableName"], operation)
            pk, sk = self._key(body["Item"] if kind == "Put" else body["Key"], operation)
            old = self._get(table, pk, sk)
            units += 2 * write_units(old.size if old else 1)
            expression = body.get("ConditionExpression")
            expr = _Expression(
                body.get("ExpressionAttributeNames") or {},
                body.get("ExpressionAttributeValues") or {},
                operation,
            )
            held = not expression or expr.condition(expression, old.item if old else None)
            reasons.append({"Code": "None"} if held else {"Code": "ConditionalCheckFailed"})
        self.counter.record(self.service, operation, wru=units)
        if any(r["Code"] != "None" for r in reasons):
            codes = ", ".join(r["Code"] for r in reasons)
            error = _error(
                operation,
                "TransactionCanceledException",
                "Transaction cancelled, please refer cancellation reasons for specific "
                f"reasons [{codes}]",
            )
            error.response["CancellationReasons"] = reasons
            raise error
        counter, self.counter = self.counter, RequestCounter()  # counted above, as a whole
        try:
            for entry in TransactItems:
                ((kind, body),) = entry.items()
                if kind == "Update":
                    self.update_item(**body)  # its condition held a moment ago: it holds
                elif kind == "Put":
                    self.put_item(**body)
        finally:
            self.counter = counter
        return {}


# --- SQS -----------------------------------------------------------------------------------


@dataclass
class SqsMessage:
    """One message in a fake queue."""

    message_id: str
    body: str
    sent_ms: int
    visible_ms: int
    group_id: str | None = None
    receive_count: int = 0
    first_receive_ms: int | None = None
    receipt_handle: str | None = None


@dataclass
class _Queue:
    url: str
    fifo: bool
    messages: dict[str, SqsMessage] = field(default_factory=dict)
    heap: list[tuple[int, int, str]] = field(default_factory=list)
    handles: dict[str, str] = field(default_factory=dict)
    dedup: dict[str, tuple[int, str]] = field(default_factory=dict)


def _chunks(payload_bytes: int) -> int:
    return max(1, math.ceil(payload_bytes / SQS_CHUNK_BYTES))


class FakeSqs:
    """A low-level SQS client: batched and single sends (with DelaySeconds and FIFO
    de-duplication), receives with visibility timeouts, deletes and ``ChangeMessageVisibility``.

    Time comes from ``clock`` (epoch ms), so a fake clock drives delays and visibility.
    """

    service = "sqs"
    account = "123456789012"
    region = "us-east-1"

    def __init__(self, counter: RequestCounter | None = None, clock: MsClock | None = None) -> None:
        self.counter = counter or RequestCounter()
        self.clock: MsClock = clock or (lambda: 0)
        self._queues: dict[str, _Queue] = {}
        self._seq = itertools.count()
        self._ids = itertools.count()

    # Administration ----------------------------------------------------------------------

    def create_queue(
        self,
        *,
        QueueName: str,  # noqa: N803
        Attributes: Mapping[str, str] | None = None,  # noqa: N803
    ) -> dict[str, str]:
        """Create a queue (FIFO when the name ends in ``.fifo``); not counted."""
        url = f"https://sqs.{self.region}.amazonaws.com/{self.account}/{QueueName}"
        fifo = QueueName.endswith(".fifo") or (Attributes or {}).get("FifoQueue") == "true"
        self._queues.setdefault(url, _Queue(url, fifo))
        return {"QueueUrl": url}

    def depth(self, url: str) -> int:
        """Messages in the queue: visible, delayed or in flight."""
        return len(self._queue(url, "GetQueueAttributes").messages)

    def messages(self, url: str) -> list[SqsMessage]:
        """Every message still in the queue."""
        return list(self._queue(url, "ReceiveMessage").messages.values())

    def next_visible_ms(self, url: str) -> int | None:
        """When the next message of the queue becomes visible (None: the queue is empty);
        what a long-polling consumer waits for."""
        queue = self._queue(url, "ReceiveMessage")
        while queue.heap:
            visible_ms, _, message_id = queue.heap[0]
            message = queue.messages.get(message_id)
            if message is not None and message.visible_ms == visible_ms:
                return visible_ms
            heapq.heappop(queue.heap)  # deleted, or re-hidden since this entry was pushed
        return None

    # Helpers -----------------------------------------------------------------------------

    def _queue(self, url: str, operation: str) -> _Queue:
        queue = self._queues.get(url)
        if queue is None:
            raise _error(
                operation,
                "AWS.SimpleQueueService.NonExistentQueue",
                "The specified queue does not exist.",
            )
        return queue

    def _record(self, queue: _Queue, operation: str, payload_bytes: int) -> None:
        unit = "fifo" if queue.fifo else "standard"
        self.counter.record(self.service, operation, **{unit: _chunks(payload_bytes)})

    def _enqueue(
        self, queue: _Queue, body: str, delay_seconds: int, group_id: str | None
    ) -> SqsMessage:
        now = self.clock()
        message = SqsMessage(
            message_id=f"{next(self._ids):08d}-0000-4000-8000-000000000000",
            body=body,
            sent_ms=now,
            visible_ms=now + delay_seconds * 1000,
            group_id=group_id,
        )
        queue.messages[message.message_id] = message
        heapq.heappush(queue.heap, (message.visible_ms, next(self._seq), message.message_id))
        return message

    def _by_handle(self, queue: _Queue, handle: str, operation: str) -> SqsMessage:
        message_id = queue.handles.get(handle)
        message = queue.messages.get(message_id) if message_id else None
        if message is None or message.receipt_handle != handle:
            raise _error(
                operation, "ReceiptHandleIsInvalid", "The input receipt handle is invalid."
            )
        return message

    # API ---------------------------------------------------------------------------------

    def send_message_batch(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        Entries: Sequence[Mapping[str, Any]],  # noqa: N803
    ) -> dict[str, Any]:
        """Up to 10 entries with distinct ids; every valid entry is taken."""
        operation = "SendMessageBatch"
        queue = self._queue(QueueUrl, operation)
        if not Entries:
            raise _error(
                operation,
                "AWS.SimpleQueueService.EmptyBatchRequest",
                "There should be at least one SendMessageBatchRequestEntry in the request.",
            )
        if len(Entries) > SQS_MAX_BATCH_ENTRIES:
            raise _error(
                operation,
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                f"Maximum number of entries per request are 10. You have sent {len(Entries)}.",
            )
        ids = [e["Id"] for e in Entries]
        if len(set(ids)) != len(ids):
            raise _error(
                operation, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "Id repeated."
            )
        payload = sum(len(e["MessageBody"].encode()) for e in Entries)
        if payload > SQS_MAX_BATCH_BYTES:
            raise _error(
                operation,
                "AWS.SimpleQueueService.BatchRequestTooLong",
                "Batch requests cannot be longer than the maximum message size.",
            )
        successful, failed = [], []
        for entry in Entries:
            delay = int(entry.get("DelaySeconds", 0))
            if not 0 <= delay <= SQS_MAX_DELAY_SECONDS:
                failed.append(
                    {
                        "Id": entry["Id"],
                        "SenderFault": True,
                        "Code": "InvalidParameterValue",
                        "Message": "DelaySeconds must be 0..900",
                    }
                )
                continue
            message = self._enqueue(queue, entry["MessageBody"], delay, entry.get("MessageGroupId"))
            successful.append({"Id": entry["Id"], "MessageId": message.message_id})
        self._record(queue, operation, payload)
        return {"Successful": successful, "Failed": failed}

    def send_message(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        MessageBody: str,  # noqa: N803
        DelaySeconds: int = 0,  # noqa: N803
        MessageGroupId: str | None = None,  # noqa: N803
        MessageDeduplicationId: str | None = None,  # noqa: N803
    ) -> dict[str, Any]:
        """One message; on a FIFO queue a de-duplication id seen in the last 5 minutes is
        accepted and dropped."""
        operation = "SendMessage"
        queue = self._queue(QueueUrl, operation)
        self._record(queue, operation, len(MessageBody.encode()))
        if queue.fifo:
            if not MessageGroupId:
                raise _error(
                    operation,
                    "MissingParameter",
                    "The request must contain the parameter MessageGroupId.",
                )
            now = self.clock()
            if MessageDeduplicationId:
                seen = queue.dedup.get(MessageDeduplicationId)
                if seen is not None and now - seen[0] < FIFO_DEDUP_MS:
                    return {"MessageId": seen[1]}
            message = self._enqueue(queue, MessageBody, 0, MessageGroupId)
            if MessageDeduplicationId:
                queue.dedup[MessageDeduplicationId] = (now, message.message_id)
            return {"MessageId": message.message_id}
        return {"MessageId": self._enqueue(queue, MessageBody, DelaySeconds, None).message_id}

    def receive_message(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        MaxNumberOfMessages: int = 1,  # noqa: N803
        VisibilityTimeout: int = 30,  # noqa: N803
        WaitTimeSeconds: int = 0,  # noqa: N803 -- nothing to wait for in memory
        AttributeNames: Sequence[str] | None = None,  # noqa: N803 -- all are returned
        MessageSystemAttributeNames: Sequence[str] | None = None,  # noqa: N803
    ) -> dict[str, Any]:
        """Up to ``MaxNumberOfMessages`` visible messages, hidden for ``VisibilityTimeout``."""
        operation = "ReceiveMessage"
        queue = self._queue(QueueUrl, operation)
        now = self.clock()
        out: list[dict[str, Any]] = []
        payload = 0
        while queue.heap and len(out) < min(MaxNumberOfMessages, SQS_MAX_BATCH_ENTRIES):
            visible_ms, _, message_id = queue.heap[0]
            if visible_ms > now:
                break
            heapq.heappop(queue.heap)
            message = queue.messages.get(message_id)
            if message is None or message.visible_ms != visible_ms:
                continue  # deleted, or re-hidden since this entry was pushed
            message.receive_count += 1
            if message.first_receive_ms is None:
                message.first_receive_ms = now
            if message.receipt_handle:
                queue.handles.pop(message.receipt_handle, None)
            message.receipt_handle = f"{message_id}#{message.receive_count}"
            queue.handles[message.receipt_handle] = message_id
            message.visible_ms = now + VisibilityTimeout * 1000
            heapq.heappush(queue.heap, (message.visible_ms, next(self._seq), message_id))
            payload += len(message.body.encode())
            out.append(
                {
                    "MessageId": message.message_id,
                    "ReceiptHandle": message.receipt_handle,
                    "Body": message.body,
                    "Attributes": {
                        "ApproximateReceiveCount": str(message.receive_count),
                        "SentTimestamp": str(message.sent_ms),
                        "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
                    },
                }
            )
        self._record(queue, operation, payload)
        return {"Messages": out} if out else {}

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> dict[str, Any]:  # noqa: N803
        """Delete one received message."""
        operation = "DeleteMessage"
        queue = self._queue(QueueUrl, operation)
        self._record(queue, operation, 0)
        message = self._by_handle(queue, ReceiptHandle, operation)
        del queue.messages[message.message_id]
        return {}

    def delete_message_batch(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        Entries: Sequence[Mapping[str, str]],  # noqa: N803
    ) -> dict[str, Any]:
        """Delete up to 10 received messages; an invalid handle fails that entry only."""

        def delete(queue: _Queue, message: SqsMessage, _entry: Mapping[str, Any]) -> None:
            del queue.messages[message.message_id]

        return self._each_handle(QueueUrl, "DeleteMessageBatch", Entries, delete)

    def _each_handle(
        self,
        url: str,
        operation: str,
        entries: Sequence[Mapping[str, Any]],
        apply: Callable[[_Queue, SqsMessage, Mapping[str, Any]], None],
    ) -> dict[str, Any]:
        """A batch call on received messages: ``apply`` to each entry's message; an invalid
        receipt handle fails that entry only."""
        queue = self._queue(url, operation)
        if len(entries) > SQS_MAX_BATCH_ENTRIES:
            raise _error(
                operation,
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                f"Maximum number of entries per request are 10. You have sent {len(entries)}.",
            )
        self._record(queue, operation, 0)
        successful, failed = [], []
        for entry in entries:
            try:
                message = self._by_handle(queue, entry["ReceiptHandle"], operation)
            except ClientError:
                failed.append(
                    {"Id": entry["Id"], "SenderFault": True, "Code": "ReceiptHandleIsInvalid"}
                )
                continue
            apply(queue, message, entry)
            successful.append({"Id": entry["Id"]})
        return {"Successful": successful, "Failed": failed}

    def change_message_visibility(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        ReceiptHandle: str,  # noqa: N803
        VisibilityTimeout: int,  # noqa: N803
    ) -> dict[str, Any]:
        """Hide a received message for ``VisibilityTimeout`` seconds from now."""
        operation = "ChangeMessageVisibility"
        queue = self._queue(QueueUrl, operation)
        self._record(queue, operation, 0)
        message = self._by_handle(queue, ReceiptHandle, operation)
        message.visible_ms = self.clock() + VisibilityTimeout * 1000
        heapq.heappush(queue.heap, (message.visible_ms, next(self._seq), message.message_id))
        return {}

    def change_message_visibility_batch(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        Entries: Sequence[Mapping[str, Any]],  # noqa: N803
    ) -> dict[str, Any]:
        """Up to 10 :meth:`change_message_visibility`; an invalid handle fails that entry only."""

        def hide(queue: _Queue, message: SqsMessage, entry: Mapping[str, Any]) -> None:
            message.visible_ms = self.clock() + int(entry["VisibilityTimeout"]) * 1000
            heapq.heappush(queue.heap, (message.visible_ms, next(self._seq), message.message_id))

        return self._each_handle(QueueUrl, "ChangeMessageVisibilityBatch", Entries, hide)


# --- S3 ------------------------------------------------------------------------------------


class _Body:
    """The streaming body of a GetObject response."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, amount: int | None = None) -> bytes:
        if amount is None:
            data, self._data = self._data, b""
            return data
        data, self._data = self._data[:amount], self._data[amount:]
        return data


class FakeS3:
    """``put_object``, ``get_object`` and ``delete_object`` on in-memory buckets."""

    service = "s3"

    def __init__(self, counter: RequestCounter | None = None) -> None:
        self.counter = counter or RequestCounter()
        self._buckets: dict[str, dict[str, bytes]] = {}

    def create_bucket(self, *, Bucket: str) -> dict[str, Any]:  # noqa: N803
        """Create a bucket (not counted)."""
        self._buckets.setdefault(Bucket, {})
        return {}

    def objects(self, bucket: str) -> dict[str, bytes]:
        """The objects of a bucket."""
        return self._bucket(bucket, "ListObjectsV2")

    def _bucket(self, name: str, operation: str) -> dict[str, bytes]:
        bucket = self._buckets.get(name)
        if bucket is None:
            raise _error(operation, "NoSuchBucket", "The specified bucket does not exist", 404)
        return bucket

    def put_object(
        self,
        *,
        Bucket: str,  # noqa: N803
        Key: str,  # noqa: N803
        Body: bytes | str = b"",  # noqa: N803
        ContentType: str | None = None,  # noqa: N803 -- not kept
    ) -> dict[str, Any]:
        """Store an object (replacing any)."""
        bucket = self._bucket(Bucket, "PutObject")
        bucket[Key] = Body.encode() if isinstance(Body, str) else bytes(Body)
        self.counter.record(self.service, "PutObject", put=1)
        return {"ETag": f'"{uuid.uuid4().hex}"'}

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        """Read an object; ``NoSuchKey`` (404) when missing."""
        bucket = self._bucket(Bucket, "GetObject")
        self.counter.record(self.service, "GetObject", get=1)
        if Key not in bucket:
            raise _error("GetObject", "NoSuchKey", "The specified key does not exist.", 404)
        data = bucket[Key]
        return {"Body": _Body(data), "ContentLength": len(data)}

    def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        """Delete an object; deleting a missing key succeeds (204), as on S3."""
        bucket = self._bucket(Bucket, "DeleteObject")
        bucket.pop(Key, None)
        self.counter.record(self.service, "DeleteObject", delete=1)
        return {"ResponseMetadata": {"HTTPStatusCode": 204}}
