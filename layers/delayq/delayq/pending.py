"""Pending counts: how many messages wait for each period, per target, without a table scan.

Ingest keeps, for every period in which messages will be released and every target, the number
of messages it stored and queued for it. How long a period is depends on how far ahead the
message was sent: a minute when it was sent at most an hour before its release, an hour when at
most a day before, a UTC day otherwise. Periods are grouped into items: the minutes of one hour,
the hours of one day, the days of one week (7 days from the epoch) per target, each period an
attribute pair (``s<n>`` stored, ``q<n>`` queued), so a batch writes about six items per
target whatever its delays are spread over: one ``UpdateItem`` per item and delay-topic
partition. An item lives in the partition of the UTC day it starts (``pending#<day>``, sort
key ``<first minute>#<period minutes>#<target>``).

Each record is counted once, although ingest is at-least-once (Kafka redelivers a batch that
failed after some of its counts were written). Every item keeps, per delay-topic partition, the
highest offset it has counted, and an update counts only the records above it. A partition's
records are ingested in offset order (the event source hands out a partition's next batch only
after the previous one succeeded), so whatever lies at or below that offset is counted already.

What a count is: the messages ingest kept (stored or queued) for their release time (the due
time, or the release time when a release cap deferred the message), less those a reschedule
moved away. Cancels are not subtracted (a cancel names no due time: the cancelled message is
counted until its period passes); messages due within the direct window are produced at once
and never counted. Readers read eventually consistent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from delayq import constants as c
from delayq.exceptions import StoreError
from delayq.records import DelayRequest
from delayq.retry import AWS_ERRORS, Backoff, Deadline, retry_call
from delayq.store import condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = [
    "MINUTES_PER_DAY",
    "PendingCount",
    "PendingCounts",
    "PendingTally",
    "counts_of",
    "day_of",
    "item_of",
    "minute_of",
    "pending_key",
    "period_of",
    "source_of",
]

T = TypeVar("T")
Item = dict[str, Any]

MINUTES_PER_DAY: Final = 1440
# A message sent at most this long before its release is counted in its minute; at most a
# day before, in its hour; otherwise in its day.
_MINUTE_WITHIN_MS: Final = 3600_000
_HOUR_WITHIN_MS: Final = 86_400_000
# Minutes an item spans, by the length of its periods: an hour of minutes, a day of hours, a
# week of days.
_ITEM_SPAN: Final = {1: 60, 60: MINUTES_PER_DAY, MINUTES_PER_DAY: 7 * MINUTES_PER_DAY}
# Sort keys sort as text: numbers are written with these many digits.
_MINUTE_DIGITS: Final = 10
_LENGTH_DIGITS: Final = 4
# Re-reads of a counted offset after a refused update before giving up (each re-read means
# another ingest counted into the same item meanwhile, which one partition's order rules out).
_MAX_RECOUNTS: Final = 5


def minute_of(at_ms: int) -> int:
    """The epoch minute a time falls in."""
    return at_ms // 60_000


def day_of(minute: int) -> int:
    """The UTC day (days since the epoch) of an epoch minute."""
    return minute // MINUTES_PER_DAY


def period_of(release_ms: int, sent_ms: int) -> tuple[int, int]:
    """``(first minute, minutes)`` of the period a message released at ``release_ms`` and
    sent at ``sent_ms`` (0: unknown, counted in its minute) is counted in."""
    minute = minute_of(release_ms)
    ahead = release_ms - sent_ms if sent_ms else 0
    if ahead <= _MINUTE_WITHIN_MS:
        return minute, 1
    length = 60 if ahead <= _HOUR_WITHIN_MS else MINUTES_PER_DAY
    return minute - minute % length, length


def item_of(first_minute: int, minutes: int) -> tuple[int, int]:
    """``(the item's first minute, the period's index in it)`` of a period."""
    span = _ITEM_SPAN[minutes]
    start = first_minute - first_minute % span
    return start, (first_minute - start) // minutes


def pending_key(item_minute: int, minutes: int, target: str) -> Item:
    """The key of the item holding ``target``'s counts of the periods of ``minutes`` from
    ``item_minute`` on."""
    return {
        c.ATTR_PK: {"S": f"{c.PENDING_PK_PREFIX}{day_of(item_minute)}"},
        c.ATTR_SK: {"S": f"{item_minute:0{_MINUTE_DIGITS}d}#{minutes:0{_LENGTH_DIGITS}d}#{target}"},
    }


def source_of(src: str) -> tuple[str, int] | None:
    """``(topic-partition, offset)`` of a ``topic-partition-offset`` record, else None."""
    head, _, offset = src.rpartition("-")
    return (head, int(offset)) if head and offset.isdigit() else None


@dataclass(frozen=True)
class _Entry:
    offset: int
    period: int  # the period's index in its item
    stored: int
    queued: int


@dataclass(frozen=True, order=True)
class _Key:
    minute: int  # the item's first minute
    minutes: int  # the length of its periods
    target: str
    partition: str  # the delay-topic partition, "" when the record has no coordinates


class PendingTally:
    """What one ingest batch adds to the pending counts, by the record that caused it."""

    def __init__(self) -> None:
        # Keyed by the fields of ``_Key`` as a plain tuple (it orders the same): one per
        # message is built, and a tuple costs a fraction of a frozen dataclass.
        self._entries: dict[tuple[int, int, str, str], list[_Entry]] = defaultdict(list)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def kept(self, requests: Iterable[DelayRequest], *, queued: bool) -> None:
        """Messages kept for their release time (queued or stored). A reschedule's copy is
        counted for the reschedule record, which is the one this batch holds, and from the
        time it was written."""
        for r in requests:
            src, sent = (r.moved_src, r.moved_ts_ms) if r.moved_src else (r.src, r.ts_ms)
            self._add(r, src, sent, 0 if queued else 1, 1 if queued else 0)

    def moved_away(self, originals: Iterable[DelayRequest], by_src: Iterable[str]) -> None:
        """Stored messages a reschedule (record ``by_src``) moved away from their period."""
        for r, src in zip(originals, by_src, strict=True):
            self._add(r, src, r.moved_ts_ms or r.ts_ms, -1, 0)

    def _add(self, r: DelayRequest, src: str, sent_ms: int, stored: int, queued: int) -> None:
        first, minutes = period_of(r.release_at_ms, sent_ms)
        item_minute, period = item_of(first, minutes)
        position = source_of(src)
        partition, offset = position if position is not None else ("", -1)
        self._entries[(item_minute, minutes, r.target, partition)].append(
            _Entry(offset, period, stored, queued)
        )

    def updates(self) -> list[tuple[_Key, list[_Entry]]]:
        """Each item and partition with its records, in key order."""
        return [
            (_Key(*key), entries)
            for key, entries in sorted(self._entries.items(), key=lambda pair: pair[0])
        ]


@dataclass(frozen=True)
class PendingCount:
    """Messages waiting for one period and target."""

    minute: int  # the period's first minute
    minutes: int  # its length
    target: str
    stored: int
    queued: int

    @property
    def total(self) -> int:
        return self.stored + self.queued


class PendingCounts:
    """The pending-count items of the message table. The client is injected."""

    def __init__(
        self, client: DynamoDBClient, table_name: str, *, backoff: Backoff | None = None
    ) -> None:
        self._client = client
        self._table = table_name
        self._backoff = backoff or Backoff()

    def add(self, tally: PendingTally, deadline: Deadline) -> int:
        """Write one batch's counts; returns the number of updates made. Raises StoreError
        when one cannot be written (the batch is then redelivered and counted once)."""
        return sum(self._count(key, entries, deadline) for key, entries in tally.updates())

    def _count(self, key: _Key, entries: list[_Entry], deadline: Deadline) -> int:
        if not key.partition:  # no coordinates to remember: counted as it comes
            return self._update(key, entries, None, deadline)
        first = min(e.offset for e in entries)
        try:
            return self._update(key, entries, (first, None), deadline)
        except StoreError as e:
            if not condition_failed(e):
                raise
        # Some of these records were counted before (a redelivered batch): count the rest.
        for _ in range(_MAX_RECOUNTS):
            seen = self._counted_offset(key, deadline)
            rest = [e for e in entries if e.offset > seen]
            try:
                return self._update(key, rest, (first, seen), deadline)
            except StoreError as e:
                if not condition_failed(e):
                    raise
        raise StoreError(
            f"count pending {key.minute}#{key.target}: the counted offset of {key.partition} "
            "kept moving"
        )

    def _update(
        self,
        key: _Key,
        entries: Sequence[_Entry],
        guard: tuple[int, int | None] | None,
        deadline: Deadline,
    ) -> int:
        """Add the entries; ``guard`` is (the batch's first offset of the key's partition, the
        offset read as counted or None for the first try) and makes the update count each
        record once."""
        # Summed per period first: one attribute name per period, not per record.
        stored: dict[int, int] = defaultdict(int)
        queued: dict[int, int] = defaultdict(int)
        for e in entries:
            stored[e.period] += e.stored
            queued[e.period] += e.queued
        sums = {f"{c.ATTR_PENDING_STORED}{p}": n for p, n in stored.items()}
        sums.update((f"{c.ATTR_PENDING_QUEUED}{p}", n) for p, n in queued.items())
        adds = {name: n for name, n in sorted(sums.items()) if n}
        if not adds:  # nothing to add (later offsets are above it anyway)
            return 0
        names = {f"#a{i}": name for i, name in enumerate(adds)}
        names["#ttl"] = c.ATTR_TTL
        values: Item = {f":a{i}": {"N": str(n)} for i, n in enumerate(adds.values())}
        values[":kind"] = {"S": c.KIND_PENDING}
        span = _ITEM_SPAN[key.minutes]
        values[":expires"] = {"N": str((key.minute + span) * 60 + c.PENDING_KEEP_SECONDS)}
        expression = (
            "ADD "
            + ", ".join(f"#a{i} :a{i}" for i in range(len(adds)))
            + " SET kind = :kind, #ttl = :expires"
        )
        kwargs: dict[str, Any] = {}
        if guard is not None:
            first, seen = guard
            names["#o"] = c.ATTR_PENDING_OFFSET_PREFIX + key.partition
            values[":last"] = {"N": str(max(e.offset for e in entries))}
            expression += ", #o = :last"
            if seen is None:
                values[":first"] = {"N": str(first)}
                kwargs["ConditionExpression"] = "attribute_not_exists(#o) OR #o < :first"
            elif seen < 0:
                kwargs["ConditionExpression"] = "attribute_not_exists(#o)"
            else:
                values[":seen"] = {"N": str(seen)}
                kwargs["ConditionExpression"] = "#o = :seen"
        self._call(
            "count pending",
            partial(
                self._client.update_item,
                TableName=self._table,
                Key=pending_key(key.minute, key.minutes, key.target),
                UpdateExpression=expression,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                **kwargs,
            ),
            deadline,
        )
        return 1

    def _counted_offset(self, key: _Key, deadline: Deadline) -> int:
        """The highest offset of the key's partition the item has counted (-1: none), read
        strongly consistent."""
        name = c.ATTR_PENDING_OFFSET_PREFIX + key.partition
        response = self._call(
            "read pending count",
            partial(
                self._client.get_item,
                TableName=self._table,
                Key=pending_key(key.minute, key.minutes, key.target),
                ConsistentRead=True,
                ProjectionExpression="#o",
                ExpressionAttributeNames={"#o": name},
            ),
            deadline,
        )
        attr = response.get("Item", {}).get(name)
        return -1 if attr is None else int(attr["N"])

    def read(
        self, first_minute: int, last_minute: int, deadline: Deadline
    ) -> Iterator[PendingCount]:
        """The counts of the periods overlapping minutes ``first_minute..last_minute``
        (inclusive), in item order: one Query per UTC day from the week before (whose item
        of days may reach into the range), eventually consistent."""
        earliest = day_of(first_minute) - 7
        for day in range(earliest, day_of(last_minute) + 1):
            for item in self._query_day(day, deadline):
                yield from counts_of(item, first_minute, last_minute)

    def _query_day(self, day: int, deadline: Deadline) -> Iterator[Item]:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": f"{c.PENDING_PK_PREFIX}{day}"}},
        }
        while True:
            page = self._call(
                "query pending counts", partial(self._client.query, **kwargs), deadline
            )
            yield from page.get("Items", [])
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last

    def _call(self, operation: str, call: Callable[[], T], deadline: Deadline) -> T:
        try:
            return retry_call(operation, call, self._backoff, deadline)
        except AWS_ERRORS as e:
            raise StoreError(f"{operation}: {e}") from e


def counts_of(
    item: Item, first_minute: int = 0, last_minute: int = 2**62
) -> Iterator[PendingCount]:
    """The periods of one pending-count item (that overlap the range), with their counts."""
    item_minute, minutes, target = item[c.ATTR_SK]["S"].split("#", 2)
    start, length = int(item_minute), int(minutes)
    periods: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for name, value in item.items():
        kind, number = name[:1], name[1:]
        if kind in (c.ATTR_PENDING_STORED, c.ATTR_PENDING_QUEUED) and number.isdigit():
            periods[int(number)][kind == c.ATTR_PENDING_QUEUED] += int(value["N"])
    for period, (stored, queued) in sorted(periods.items()):
        minute = start + period * length
        if minute <= last_minute and minute + length > first_minute:
            yield PendingCount(minute, length, target, stored, queued)
