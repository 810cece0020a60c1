"""Weak semantics that belong to one service: DynamoDB's eventually consistent reads, TTL and
its stream; S3's lifecycle expiry; the target Kafka cluster's outages and lost delivery
reports.

The in-memory clients of :mod:`testkit.aws` are strongly consistent and never expire
anything; this module adds what AWS documents on top of them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from botocore.exceptions import ClientError
from confluent_kafka import KafkaError

from delayq import constants as c
from sim.faults import Knobs
from sim.world import World
from testkit.aws import (
    FakeDynamoDB,
    FakeS3,
    RequestCounter,
    item_size,
    read_units,
    write_units,
)
from testkit.kafka import FakeProducer, ProducedRecord


class PartitionBudget:
    """DynamoDB's throughput per partition key: at most ``partition_wcu`` write units and
    ``partition_rcu`` read units a second (a single key is one partition; adaptive capacity
    cannot split it). A call on a key whose budget for the current second is spent is
    throttled: ``ProvisionedThroughputExceededException``, nothing done."""

    def __init__(self, world: World, knobs: Knobs) -> None:
        self.world = world
        self.knobs = knobs
        self._second = -1
        self._used: dict[tuple[str, str], float] = {}  # (kind, pk) -> units this second

    def admit(self, kind: str, pks: Sequence[str], operation: str) -> None:
        """Raise the throttling error when any of ``pks`` has spent its ``kind`` budget."""
        self._roll()
        limit = self.knobs.partition_wcu if kind == "write" else self.knobs.partition_rcu
        used = self._used
        for pk in pks:
            if used.get((kind, pk), 0) < limit:
                continue
            self.world.faults["dynamodb-hot-partition"] += 1
            raise ClientError(
                {
                    "Error": {
                        "Code": "ProvisionedThroughputExceededException",
                        "Message": "Throughput exceeds the current capacity of your table "
                        "or index.",
                    },
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                operation,
            )

    def spend(self, kind: str, pk: str, units: float) -> None:
        """Count ``units`` against ``pk``'s budget for this second."""
        self._roll()
        self._used[(kind, pk)] = self._used.get((kind, pk), 0) + units

    def _roll(self) -> None:
        second = self.world.now_ms // 1000
        if second != self._second:
            self._second, self._used = second, {}


# DynamoDB keeps three copies of a table (three Availability Zones): the leader and two.
FOLLOWERS: Final = 2


class ReplicatedDynamoDB:
    """A table with lagging followers and a throughput budget per partition key. Writes go to
    the primary (the leader) and reach each follower up to ``stale_read_ms`` later, in order,
    each follower at its own pace; a read without ``ConsistentRead`` is answered by one of the
    three copies drawn for that read alone, so two reads in a row may see a newer state and
    then an older one (not monotonic); strongly consistent reads by the primary."""

    def __init__(self, world: World, knobs: Knobs, counter: RequestCounter) -> None:
        self.world = world
        self.knobs = knobs
        self.primary = FakeDynamoDB(counter)
        self.followers = [FakeDynamoDB(RequestCounter()) for _ in range(FOLLOWERS)]
        self.budget = PartitionBudget(world, knobs)
        self._applied_until = [0] * FOLLOWERS
        # Called with the table and the keys of each write the primary took (TTL watches).
        self.on_write: Callable[[str, list[tuple[str, str]]], None] = lambda _t, _k: None

    def create_table(self, name: str) -> None:
        """On every copy."""
        self.primary.create_table(name)
        for follower in self.followers:
            follower.create_table(name)

    def items(self, name: str) -> list[dict[str, Any]]:
        """The primary's items."""
        return self.primary.items(name)

    # The API: writes go to the primary (and are replayed on the replica), reads as asked.

    def put_item(self, **kwargs: Any) -> Any:
        return self._write("put_item", kwargs)

    def update_item(self, **kwargs: Any) -> Any:
        return self._write("update_item", kwargs)

    def delete_item(self, **kwargs: Any) -> Any:
        return self._write("delete_item", kwargs)

    def batch_write_item(self, **kwargs: Any) -> Any:
        return self._write("batch_write_item", kwargs)

    def transact_write_items(self, **kwargs: Any) -> Any:
        return self._write("transact_write_items", kwargs)

    def get_item(self, **kwargs: Any) -> Any:
        return self._read("get_item", kwargs)

    def query(self, **kwargs: Any) -> Any:
        return self._read("query", kwargs)

    def batch_get_item(self, **kwargs: Any) -> Any:
        return self._read("batch_get_item", kwargs)

    def _write(self, name: str, kwargs: dict[str, Any]) -> Any:
        units = _write_units(name, kwargs)
        self.budget.admit("write", list(units), name)
        answer = getattr(self.primary, name)(**kwargs)  # raises when a condition fails
        for pk, n in units.items():
            self.budget.spend("write", pk, n)
        if answer.get("UnprocessedItems"):
            raise NotImplementedError("the in-memory primary never leaves items unprocessed")
        for table, keys in _written_keys(name, kwargs).items():
            self.on_write(table, keys)
        replay = copy.deepcopy(kwargs)
        replay.pop("ConditionExpression", None)  # it held on the primary, in the same order
        for entry in replay.get("TransactItems", []):
            for body in entry.values():
                body.pop("ConditionExpression", None)
        for n, follower in enumerate(self.followers):
            lag = self.world.rng.randint(0, self.knobs.stale_read_ms)
            self._applied_until[n] = max(self._applied_until[n], self.world.now_ms + lag)
            self.world.at(self._applied_until[n], partial(self._replay, follower, name, replay))
        return answer

    @staticmethod
    def _replay(follower: FakeDynamoDB, name: str, kwargs: dict[str, Any]) -> None:
        getattr(follower, name)(**kwargs)

    def stored(self, name: str, pk: str, sk: str) -> dict[str, Any] | None:
        """The primary's item at a key (not an API call: nothing counted)."""
        found = self.primary._get(self.primary._table(name, "GetItem"), pk, sk)
        return None if found is None else found.item

    def _read(self, name: str, kwargs: dict[str, Any]) -> Any:
        if name == "batch_get_item":
            consistent = all(s.get("ConsistentRead") for s in kwargs["RequestItems"].values())
        else:
            consistent = bool(kwargs.get("ConsistentRead"))
        pk = _read_key(name, kwargs)
        if pk is not None:
            self.budget.admit("read", (pk,), name)
        copy_ = 0
        if not consistent and self.knobs.stale_read_ms:
            copy_ = self.world.rng.randrange(FOLLOWERS + 1)  # each read its own copy
        if copy_:
            self.world.faults["dynamodb-stale-read"] += 1
            answer = getattr(self.followers[copy_ - 1], name)(**kwargs)
        else:
            answer = getattr(self.primary, name)(**kwargs)
        if pk is not None:
            found = answer.get("Items") or ([answer["Item"]] if answer.get("Item") else [])
            size = sum(map(item_size, found))
            self.budget.spend("read", pk, read_units(size, consistent))
        return answer


def _write_units(name: str, kwargs: Mapping[str, Any]) -> dict[str, float]:
    """Write units by partition key (an update or delete counts one unit: its item's size is
    not known from the request)."""
    if name == "batch_write_item":
        units: dict[str, float] = {}
        for writes in kwargs["RequestItems"].values():
            for w in writes:
                put = w.get("PutRequest")
                item = put["Item"] if put else w["DeleteRequest"]["Key"]
                n = write_units(item_size(item)) if put else 1
                units[item["pk"]["S"]] = units.get(item["pk"]["S"], 0) + n
        return units
    if name == "put_item":
        return {kwargs["Item"]["pk"]["S"]: write_units(item_size(kwargs["Item"]))}
    if name == "transact_write_items":
        per_key: dict[str, float] = {}
        for entry in kwargs["TransactItems"]:
            ((kind, body),) = entry.items()
            key = body["Item"] if kind == "Put" else body["Key"]
            per_key[key["pk"]["S"]] = per_key.get(key["pk"]["S"], 0) + 2
        return per_key
    return {kwargs["Key"]["pk"]["S"]: 1}


def _written_keys(name: str, kwargs: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """The keys a write touched, by table."""
    if name == "batch_write_item":
        out: dict[str, list[tuple[str, str]]] = {}
        for table, writes in kwargs["RequestItems"].items():
            for w in writes:
                put = w.get("PutRequest")
                key = put["Item"] if put else w["DeleteRequest"]["Key"]
                out.setdefault(table, []).append((key["pk"]["S"], key["sk"]["S"]))
        return out
    if name == "transact_write_items":
        touched: dict[str, list[tuple[str, str]]] = {}
        for entry in kwargs["TransactItems"]:
            ((kind, body),) = entry.items()
            if kind != "ConditionCheck":
                key = body["Item"] if kind == "Put" else body["Key"]
                touched.setdefault(body["TableName"], []).append((key["pk"]["S"], key["sk"]["S"]))
        return touched
    key = kwargs["Item"] if name == "put_item" else kwargs["Key"]
    return {kwargs["TableName"]: [(key["pk"]["S"], key["sk"]["S"])]}


def _read_key(name: str, kwargs: Mapping[str, Any]) -> str | None:
    """The partition key a GetItem or a Query on the table reads (None: a batch read, an
    index query; not budgeted here)."""
    if name == "get_item":
        return str(kwargs["Key"]["pk"]["S"])
    if name == "query" and not kwargs.get("IndexName"):
        values = kwargs.get("ExpressionAttributeValues") or {}
        pk = values.get(":pk")
        return None if pk is None else str(pk["S"])
    return None


# DynamoDB Streams keep a record 24 hours; older records are trimmed, never read.
STREAM_RETENTION_MS: Final = 24 * 3_600_000


@dataclass
class StreamRecord:
    """One DynamoDB stream record (the shape the cleanup function reads), and when it was
    written to the stream (it is trimmed ``STREAM_RETENTION_MS`` later)."""

    sequence: int
    raw: dict[str, Any]
    at_ms: int = 0


class Ttl:
    """DynamoDB TTL: an expired item is deleted at a moment drawn up to ``ttl_lag_s`` after
    its expiry, or after the write for an item written already expired (``ttl_prompt`` of
    them within ``ttl_prompt_lag_s``), and stays readable until then; each deletion is a
    stream record with the service principal as its identity (delivered at least once).

    Event-driven: each write of an item with a TTL plans one deletion event for that item and
    that expiry; the event deletes the item only if it still carries that expiry. A long lag
    thus costs no more events than a short one."""

    def __init__(self, world: World, knobs: Knobs, table: ReplicatedDynamoDB, name: str) -> None:
        self.world = world
        self.knobs = knobs
        self.table = table
        self.name = name
        self.stream: list[StreamRecord] = []
        # Called after each deletion that appended stream records (the stream's event source).
        self.on_records: Callable[[], None] = lambda: None
        self.deleted = 0
        # Every item TTL deleted, as it was (one per deletion, however often it was streamed).
        self.deleted_items: list[dict[str, Any]] = []
        self._planned: set[tuple[str, str, str]] = set()
        self._sequence = 0

    def start(self) -> None:
        """Watch the table's writes from now on (and plan what it already holds)."""
        self.table.on_write = self._written
        for item in self.table.items(self.name):
            self._plan(item)

    def _written(self, table: str, keys: list[tuple[str, str]]) -> None:
        if table != self.name:
            return
        for pk, sk in keys:
            item = self.table.stored(self.name, pk, sk)
            if item is not None:
                self._plan(item)

    def _plan(self, item: dict[str, Any]) -> None:
        expires = item.get(c.ATTR_TTL, {}).get("N")
        if expires is None:
            return
        key = (item["pk"]["S"], item["sk"]["S"], expires)
        if key in self._planned:
            return
        self._planned.add(key)
        prompt = self.world.rng.random() < self.knobs.ttl_prompt
        bound_s = self.knobs.ttl_prompt_lag_s if prompt else self.knobs.ttl_lag_s
        lag = self.world.rng.randint(0, bound_s * 1000)
        when = max(int(expires) * 1000, self.world.now_ms) + lag
        self.world.at(when, lambda: self._expire(key))

    def _expire(self, key: tuple[str, str, str]) -> None:
        """Delete the item if it still carries the expiry this event was planned for."""
        self._planned.discard(key)
        pk, sk, expires = key
        item = self.table.stored(self.name, pk, sk)
        if item is None or item.get(c.ATTR_TTL, {}).get("N") != expires:
            return  # deleted, or given another expiry (planned by its own write)
        self._delete(item)
        self.on_records()

    def sweep(self) -> None:
        """Delete at once every expired item (a lag of nothing; for tests)."""
        now = self.world.now_ms
        before = len(self.stream)
        for item in self.table.items(self.name):
            expires = item.get(c.ATTR_TTL, {}).get("N")
            if expires is not None and int(expires) * 1000 <= now:
                self._delete(item)
        if len(self.stream) > before:
            self.on_records()

    def _delete(self, item: dict[str, Any]) -> None:
        image = copy.deepcopy(item)
        self.table.delete_item(TableName=self.name, Key={"pk": image["pk"], "sk": image["sk"]})
        self.deleted += 1
        self.deleted_items.append(image)
        copies = 2 if self.world.chance(self.knobs.stream_duplicate, "stream-duplicate") else 1
        for _ in range(copies):
            self._sequence += 1
            self.stream.append(
                StreamRecord(
                    self._sequence,
                    {
                        "eventID": str(self._sequence),
                        "eventName": "REMOVE",
                        "eventSource": "aws:dynamodb",
                        "userIdentity": {"type": "Service", "principalId": c.TTL_PRINCIPAL},
                        "dynamodb": {
                            "Keys": {"pk": image["pk"], "sk": image["sk"]},
                            "OldImage": image,
                            "SequenceNumber": str(self._sequence).zfill(21),
                            "StreamViewType": "NEW_AND_OLD_IMAGES",
                        },
                    },
                    self.world.now_ms,
                )
            )


DAY_MS: Final = 86_400_000


def lifecycle_expiry_ms(written_ms: int, days: int) -> int:
    """When a lifecycle rule of ``days`` makes an object written at ``written_ms`` eligible
    for expiry: ``days`` after its creation, rounded to the next midnight UTC."""
    return (written_ms + days * DAY_MS) // DAY_MS * DAY_MS + DAY_MS


@dataclass(frozen=True)
class ExpiryRule:
    """A lifecycle rule's expiration of current objects: a key prefix and days."""

    prefix: str
    days: int

    @classmethod
    def of(cls, configuration: Mapping[str, Any] | None) -> list[ExpiryRule]:
        """The enabled expiration rules of a ``LifecycleConfiguration`` (the template's)."""
        return [
            cls(str(rule.get("Prefix", "")), int(rule["ExpirationInDays"]))
            for rule in (configuration or {}).get("Rules", [])
            if rule.get("Status") == "Enabled" and "ExpirationInDays" in rule
        ]


class LifecycleS3(FakeS3):
    """S3 with buckets' lifecycle expiry: an object under a rule's prefix becomes eligible at
    :func:`lifecycle_expiry_ms` of its last write, and is removed asynchronously, up to
    ``s3_expiry_lag_s`` later (readable until then; on a versioned bucket the delete marker
    makes it unreadable the same way). One event per write; an overwrite restarts the count."""

    def __init__(self, world: World, knobs: Knobs, counter: RequestCounter) -> None:
        super().__init__(counter)
        self.world = world
        self.knobs = knobs
        self.rules: dict[str, list[ExpiryRule]] = {}
        self.expired: list[tuple[str, str]] = []  # (bucket, key), in removal order
        self._written: dict[tuple[str, str], int] = {}

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        """Store an object; plan its expiry under the first rule whose prefix it has."""
        answer = super().put_object(**kwargs)
        bucket, key = kwargs["Bucket"], kwargs["Key"]
        now = self.world.now_ms
        self._written[(bucket, key)] = now
        for rule in self.rules.get(bucket, ()):
            if key.startswith(rule.prefix):
                lag = self.world.rng.randint(0, self.knobs.s3_expiry_lag_s * 1000)
                when = lifecycle_expiry_ms(now, rule.days) + lag
                self.world.at(when, lambda: self._expire(bucket, key, now))
                break
        return answer

    def _expire(self, bucket: str, key: str, written_ms: int) -> None:
        if self._written.get((bucket, key)) != written_ms:
            return  # written again since: its own write planned its expiry
        if self.objects(bucket).pop(key, None) is not None:
            self.expired.append((bucket, key))
            self.world.faults["s3-lifecycle-expired"] += 1


@dataclass
class Produced:
    """A record written to the target cluster, with who wrote it and when (true time)."""

    record: ProducedRecord
    at_ms: int
    function: str


@dataclass
class TargetCluster:
    """The target Kafka cluster: every record written, and when it is down."""

    outages: list[tuple[int, int]] = field(default_factory=list)
    log: list[Produced] = field(default_factory=list)
    # The target topics' max.message.bytes: what the README asks for (the payload limit +
    # 64 KiB); a larger record is refused by the broker.
    max_message_bytes: int = c.DEFAULT_MAX_PAYLOAD_BYTES + c.KAFKA_RECORD_OVERHEAD_BYTES

    def down(self, now_ms: int) -> bool:
        """Whether brokers cannot be reached at ``now_ms``."""
        return any(start <= now_ms < end for start, end in self.outages)


class SimProducer(FakeProducer):
    """A function's ``confluent_kafka.Producer`` on the simulated cluster: records are
    written at the flush (one round trip), unless the cluster is down (a transport error for
    each); a delivery report may be lost after the write (the record is there, the report says
    it timed out); ``produce()`` itself may refuse a record (its local queue full)."""

    def __init__(self, world: World, knobs: Knobs, cluster: TargetCluster, function: str) -> None:
        super().__init__(keep=False)
        self.world = world
        self.knobs = knobs
        self.cluster = cluster
        self.function = function

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """Queue one record (or refuse it, as a full local queue does)."""
        if self.world.chance(self.knobs.produce_refused, "kafka-produce-refused"):
            raise BufferError("Local: Queue full")
        super().produce(topic, value, key, headers, on_delivery, **kwargs)

    def poll(self, timeout: float = 0) -> int:
        """Delivery reports come with the flush."""
        return 0

    def flush(self, timeout: float = 0) -> int:
        """Write every queued record and serve the reports, after one round trip."""
        if len(self):
            self.world.pause(self.world.rng.randint(2, 20))
        return super().flush(timeout)

    def _error_for(self, record: ProducedRecord) -> KafkaError | None:
        if self.cluster.down(self.world.now_ms):
            self.world.faults["kafka-down"] += 1
            return KafkaError(KafkaError._TRANSPORT)
        size = len(record.key or b"") + len(record.value or b"")
        size += sum(len(name) + len(value or b"") for name, value in record.headers)
        if size > self.cluster.max_message_bytes:
            self.world.faults["kafka-record-too-large"] += 1
            return KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
        self.cluster.log.append(Produced(record, self.world.now_ms, self.function))
        if self.world.chance(self.knobs.report_lost, "kafka-report-lost"):
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return None
