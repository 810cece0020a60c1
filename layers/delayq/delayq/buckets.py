"""Time-bucket keys and the horizon arithmetic that decides where a message waits.

A stored message lives under the partition key ``<due-second>#<shard>``: one due-second is
spread over ``shards`` partitions so that a burst sharing one second is not capped by one
DynamoDB partition's 1,000 writes per second. The scheduler queries every shard of every
second from the watermark up to now + look-ahead.
"""

from __future__ import annotations

import enum
import math
import zlib

from delayq import constants as c

__all__ = [
    "Ranges",
    "Route",
    "add_late",
    "bucket_key",
    "bucket_keys",
    "due_second",
    "expires_at",
    "format_ranges",
    "late_cutoff",
    "parse_bucket_key",
    "parse_ranges",
    "queue_delay_seconds",
    "route",
    "scheduling_window",
    "shard_of",
    "tick_dedup_id",
    "tick_index",
    "visibility_delay_seconds",
]


class Route(enum.Enum):
    """Where a delay request waits."""

    QUEUE = "queue"  # due within the horizon: SQS DelaySeconds does the waiting
    STORE = "store"  # due later: DynamoDB until the scheduler picks it up


def due_second(due_ms: int) -> int:
    """The whole epoch second a due time falls in (floor, also for negative values)."""
    return due_ms // 1000


def shard_of(delay_id: str, shards: int) -> int:
    """A shard chosen by a hash that is stable across processes (unlike ``hash()``)."""
    return zlib.crc32(delay_id.encode("utf-8")) % shards


def bucket_key(second: int, shard: int) -> str:
    """The partition key of one shard of one due-second."""
    return f"{second}#{shard}"


def parse_bucket_key(key: str) -> tuple[int, int]:
    """Inverse of :func:`bucket_key`."""
    second, _, shard = key.partition("#")
    return int(second), int(shard)


def bucket_keys(second: int, shards: int) -> list[str]:
    """Every partition key of one due-second."""
    return [bucket_key(second, s) for s in range(shards)]


def route(due_ms: int, now_ms: int, horizon_seconds: int) -> Route:
    """QUEUE when the message is due within the horizon (inclusive), else STORE.

    The scheduler looks ahead less far than the horizon, so anything stored is beyond every
    second the scheduler may already have passed (see ``Settings`` validation).
    """
    return Route.QUEUE if due_ms - now_ms <= horizon_seconds * 1000 else Route.STORE


def queue_delay_seconds(due_ms: int, now_ms: int, lead_ms: int = 0) -> int:
    """SQS DelaySeconds so that the queue releases at or before due, never after.

    SQS delays are whole seconds: round down, and release ``lead_ms`` early so that the
    emitter (which holds the remainder) is already polling when the message is due.
    Clamped to 0..900.
    """
    wait_ms = due_ms - now_ms - lead_ms
    if wait_ms <= 0:
        return 0
    return min(wait_ms // 1000, c.SQS_MAX_DELAY_SECONDS)


def visibility_delay_seconds(due_ms: int, now_ms: int, lead_ms: int = 0) -> int:
    """Seconds to hide a message that arrived too early, so it comes back at or before due."""
    wait_ms = due_ms - now_ms - lead_ms
    if wait_ms <= 0:
        return 0
    return min(wait_ms // 1000, c.SQS_MAX_VISIBILITY_SECONDS)


def scheduling_window(watermark: int, now_ms: int, lookahead_seconds: int) -> range:
    """The due-seconds the scheduler must still queue: after the watermark, up to the
    look-ahead. Empty when a repeated tick finds the work already done."""
    last = due_second(now_ms) + lookahead_seconds
    return range(watermark + 1, last + 1)


def tick_index(now_ms: int, tick_seconds: int) -> int:
    """The index of the tick period ``now`` falls in (the minute, with the default tick)."""
    return now_ms // (tick_seconds * 1000)


def tick_dedup_id(index: int) -> str:
    """The FIFO de-duplication id of a tick: the same for every timer firing in one period."""
    return f"tick-{index}"


def expires_at(due_ms: int, ttl_grace_seconds: int) -> int:
    """The TTL attribute (epoch seconds) of a stored message: due + grace."""
    return math.ceil(due_ms / 1000) + ttl_grace_seconds


Ranges = tuple[tuple[int, int], ...]


def late_cutoff(now_ms: int, ttl_grace_seconds: int, clock_margin_seconds: int) -> int:
    """The last due-second whose stored messages TTL may have started deleting by ``now``
    (their expiry is due + grace), with a margin for the clocks of a function and DynamoDB."""
    return due_second(now_ms) - ttl_grace_seconds + clock_margin_seconds


def add_late(
    ranges: Ranges, first: int, last: int, *, cutoff: int, now_ms: int, ttl_grace_seconds: int
) -> Ranges:
    """The late ranges after passing the due-seconds ``first..last`` at a time whose
    :func:`late_cutoff` is ``cutoff``: those at or below the cutoff are added (merged with an
    adjacent range). Ranges whose TTL removals are all long past are dropped, and the oldest
    are merged when there are too many: both only ever widen what counts as late."""
    out = [list(r) for r in ranges]
    top = min(last, cutoff)
    if first <= top:
        if out and out[-1][1] + 1 >= first:
            out[-1][1] = max(out[-1][1], top)
        else:
            out.append([first, top])
    oldest_kept = due_second(now_ms) - ttl_grace_seconds - c.LATE_RANGE_KEEP_SECONDS
    out = [r for r in out if r[1] >= oldest_kept]
    while len(out) > c.MAX_LATE_RANGES:
        out[0:2] = [[out[0][0], out[1][1]]]
    return tuple((a, b) for a, b in out)


def format_ranges(ranges: Ranges) -> str:
    """``a:b,c:d`` (the stored form)."""
    return ",".join(f"{a}:{b}" for a, b in ranges)


def parse_ranges(text: str) -> Ranges:
    """Inverse of :func:`format_ranges`."""
    out = []
    for part in text.split(","):
        if part:
            a, _, b = part.partition(":")
            out.append((int(a), int(b)))
    return tuple(out)
