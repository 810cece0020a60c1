"""Delivery statistics of the emitter: per-minute, per-target lateness histograms, cheaply stored.

The emitter keeps one `DeliveryStats` per Lambda execution environment (module level, so it lives
across invocations), calls `add` for every record Kafka acknowledged, and at the end of each
invocation writes whatever `flush(now_ms)` returns (usually nothing; at most one item per epoch
minute, each holding all target topics of that minute).

Item layout (low-level attribute values, ready for `PutItem`)::

    pk         S  stats#<epoch minute of emission>
    sk         S  <instance id>#<flush number>#<part>
    kind       S  stats
    minute     N  the epoch minute (emitted_ms // 60000)
    bounds_ms  S  "0,10,25,...,60000": the histogram's upper bucket bounds (the last is +inf)
    targets    M  {<topic>: {M: {messages, early, late_sum_ms, late_min_ms, late_max_ms: N,
                                hist: L of 19 N}}}
    expires_at N  end of the minute + retention (TTL), when a retention is set

Lateness is ``emitted_ms - due_ms`` in integer milliseconds; a negative lateness is an early
delivery and is also counted in `early`. ``hist[i]`` counts lateness in
``(BOUNDS_MS[i-1], BOUNDS_MS[i]]`` (upper bound inclusive, like Prometheus ``le`` buckets):
``hist[0]`` holds everything <= 0 (early and exactly on time), ``hist[18]`` everything above
60 s. Upper-inclusive bounds make "at most 500 ms / 1 s / 2 s late" exact counts.

Cost trade-off of the flush policy: an environment writes one item per epoch minute in which it
delivered anything (written once the minute is over), plus one per `max_messages` deliveries
within a minute. With ``m`` deliveries per environment-minute that is about
``ceil(m / max_messages) / m`` writes per message (``1/m`` when ``m`` is below
``max_messages``): 0.1 to 0.2 once an environment delivers 10 or more messages a minute, and
about 0.1 when it is busy (100 M messages a day over 50 environments). Below that rate the
ratio is higher but the absolute cost is at most one write per environment-minute (~1,440
writes a day, a fraction of a cent). Holding data longer would cut writes further but lose more
when Lambda reclaims an idle environment (statistics not yet written are gone; deliveries are
not affected) and would blur the per-minute resolution.

Pure Python: no clock reads, no AWS calls. The emitter's store adapter does the `PutItem`.
"""

from __future__ import annotations

import uuid
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from delayq import constants as c

__all__ = [
    "BOUNDS_ATTRIBUTE",
    "BOUNDS_MS",
    "BUCKETS",
    "DEFAULT_FLUSH_MAX_AGE_MS",
    "DEFAULT_FLUSH_MAX_MESSAGES",
    "DEFAULT_POLICY",
    "DEFAULT_RETENTION_SECONDS",
    "MAX_TARGETS_PER_ITEM",
    "MINUTE_MS",
    "AttributeValue",
    "DeliveryStats",
    "FlushPolicy",
    "Item",
    "MinuteStats",
    "TargetStats",
    "bucket_index",
]

BOUNDS_MS: Final[tuple[int, ...]] = (
    0,
    10,
    25,
    50,
    100,
    200,
    300,
    400,
    500,
    750,
    1000,
    1500,
    2000,
    3000,
    5000,
    10000,
    30000,
    60000,
)
"""Upper bucket bounds of the lateness histogram in ms; one more bucket holds everything above."""

BUCKETS: Final = len(BOUNDS_MS) + 1
BOUNDS_ATTRIBUTE: Final = ",".join(str(b) for b in BOUNDS_MS)
MINUTE_MS: Final = 60_000
DEFAULT_FLUSH_MAX_MESSAGES: Final = 1000
DEFAULT_FLUSH_MAX_AGE_MS: Final = 60_000
DEFAULT_RETENTION_SECONDS: Final = 90 * 24 * 3600
# ~550 bytes per target at worst (249-byte topic name, 19 counters): 256 targets stay far below
# DynamoDB's 400 KB item limit.
MAX_TARGETS_PER_ITEM: Final = 256

AttributeValue = dict[str, Any]
Item = dict[str, AttributeValue]


def bucket_index(lateness_ms: int) -> int:
    """The histogram bucket of a lateness: the first bound >= lateness, or the overflow bucket."""
    return bisect_left(BOUNDS_MS, lateness_ms)


@dataclass(slots=True)
class TargetStats:
    """Counters for one target topic in one minute."""

    messages: int = 0
    early: int = 0
    late_sum_ms: int = 0
    late_min_ms: int = 0
    late_max_ms: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, lateness_ms: int) -> None:
        """Count one delivery that was `lateness_ms` late (negative: early)."""
        if self.messages == 0:
            self.late_min_ms = self.late_max_ms = lateness_ms
        else:
            self.late_min_ms = min(self.late_min_ms, lateness_ms)
            self.late_max_ms = max(self.late_max_ms, lateness_ms)
        self.messages += 1
        self.early += lateness_ms < 0
        self.late_sum_ms += lateness_ms
        self.hist[bucket_index(lateness_ms)] += 1

    def to_attribute(self) -> AttributeValue:
        """The counters as a DynamoDB map attribute value."""
        return {
            "M": {
                "messages": _n(self.messages),
                "early": _n(self.early),
                "late_sum_ms": _n(self.late_sum_ms),
                "late_min_ms": _n(self.late_min_ms),
                "late_max_ms": _n(self.late_max_ms),
                "hist": {"L": [_n(count) for count in self.hist]},
            }
        }


@dataclass(slots=True)
class MinuteStats:
    """Everything buffered for one epoch minute of emission."""

    oldest_emitted_ms: int
    messages: int = 0
    targets: dict[str, TargetStats] = field(default_factory=dict)

    def add(self, target: str, lateness_ms: int, emitted_ms: int) -> None:
        """Count one delivery to `target`."""
        self.oldest_emitted_ms = min(self.oldest_emitted_ms, emitted_ms)
        self.messages += 1
        stats = self.targets.get(target)
        if stats is None:
            stats = self.targets[target] = TargetStats()
        stats.add(lateness_ms)


@dataclass(frozen=True)
class FlushPolicy:
    """Which buffered minutes are written now.

    A completed minute (before the minute of `now_ms`) is always written. The current minute is
    written early only when it holds `max_messages` deliveries or its oldest delivery is
    `max_age_ms` old; otherwise it waits, so that one minute usually costs one write.
    """

    max_messages: int = DEFAULT_FLUSH_MAX_MESSAGES
    max_age_ms: int = DEFAULT_FLUSH_MAX_AGE_MS

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_age_ms < 1:
            raise ValueError("max_messages and max_age_ms must be >= 1")

    def minutes_due(self, minutes: Mapping[int, MinuteStats], now_ms: int) -> list[int]:
        """The buffered minutes to write at `now_ms`, in ascending order."""
        current = now_ms // MINUTE_MS
        completed = sorted(m for m in minutes if m < current)
        open_minutes = [s for m, s in minutes.items() if m >= current]
        if open_minutes and (
            sum(s.messages for s in open_minutes) >= self.max_messages
            or now_ms - min(s.oldest_emitted_ms for s in open_minutes) >= self.max_age_ms
        ):
            return sorted(minutes)
        return completed


DEFAULT_POLICY: Final = FlushPolicy()


class DeliveryStats:
    """Accumulates delivery lateness per emission minute and target topic between flushes."""

    def __init__(
        self,
        *,
        instance_id: str | None = None,
        policy: FlushPolicy = DEFAULT_POLICY,
        retention_seconds: int | None = DEFAULT_RETENTION_SECONDS,
    ) -> None:
        """`instance_id` names this writer in sort keys (default: a random id per instance);
        `retention_seconds` sets the TTL after the end of the minute (None: keep forever)."""
        if instance_id == "":
            raise ValueError("instance_id must not be empty")
        if retention_seconds is not None and retention_seconds < 0:
            raise ValueError("retention_seconds must be >= 0")
        self.instance_id = instance_id or uuid.uuid4().hex
        self.policy = policy
        self.retention_seconds = retention_seconds
        self._flushes = 0
        self._minutes: dict[int, MinuteStats] = {}

    @property
    def pending(self) -> int:
        """Deliveries counted and not yet flushed."""
        return sum(s.messages for s in self._minutes.values())

    def add(self, target: str, due_ms: int, emitted_ms: int) -> None:
        """Count one delivery of a record due at `due_ms` and acknowledged at `emitted_ms`."""
        minute = emitted_ms // MINUTE_MS
        stats = self._minutes.get(minute)
        if stats is None:
            stats = self._minutes[minute] = MinuteStats(oldest_emitted_ms=emitted_ms)
        stats.add(target, emitted_ms - due_ms, emitted_ms)

    def should_flush(self, now_ms: int) -> bool:
        """True when `flush(now_ms)` would return items."""
        return bool(self.policy.minutes_due(self._minutes, now_ms))

    def flush(self, now_ms: int) -> list[Item]:
        """The items the policy says are due at `now_ms`, removed from the buffer.

        Write them with `PutItem` (or `BatchWriteItem`); retrying the same list is idempotent.
        """
        return self._take(self.policy.minutes_due(self._minutes, now_ms))

    def flush_all(self) -> list[Item]:
        """Every buffered minute as items, removed from the buffer."""
        return self._take(sorted(self._minutes))

    def _take(self, minutes: list[int]) -> list[Item]:
        items: list[Item] = []
        for minute in minutes:
            targets = sorted(self._minutes.pop(minute).targets.items())
            for part, start in enumerate(range(0, len(targets), MAX_TARGETS_PER_ITEM)):
                chunk = targets[start : start + MAX_TARGETS_PER_ITEM]
                items.append(self._item(minute, part, chunk))
        if items:
            self._flushes += 1
        return items

    def _item(self, minute: int, part: int, targets: list[tuple[str, TargetStats]]) -> Item:
        item: Item = {
            c.ATTR_PK: {"S": f"{c.STATS_PK_PREFIX}{minute}"},
            c.ATTR_SK: {"S": f"{self.instance_id}#{self._flushes}#{part}"},
            "kind": {"S": c.KIND_STATS},
            "minute": _n(minute),
            "bounds_ms": {"S": BOUNDS_ATTRIBUTE},
            "targets": {"M": {name: stats.to_attribute() for name, stats in targets}},
        }
        if self.retention_seconds is not None:
            end_of_minute_s = (minute + 1) * MINUTE_MS // 1000
            item[c.ATTR_TTL] = _n(end_of_minute_s + self.retention_seconds)
        return item


def _n(value: int) -> AttributeValue:
    return {"N": str(value)}
