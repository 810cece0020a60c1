"""Control clocks: per shard, the latest record second of any cancel or reschedule of the ids
in each of its buckets, so that the emitter reads an id's marker only when a control may
apply to the message (``docs/internals.md``, "Control clocks").

A control applies only to messages whose record is not later than its own, so a message whose
record second is after its bucket's clock has no control to read. Every marker write raises
the clock first (a conditional max, in any order, idempotent); the emitter reads the clocks
of its batch's shards strongly consistent, then the markers the clocks do not rule out.

A reschedule's marker write may take effect after its caller gave up on it (a timed-out
request AWS still accepts), so the marker is written in a transaction that holds only while no
emitter has *sealed* the old version's release second on its shard's clock (``z``). An emitter
reads its markers only under a seal at least as late as the stored messages it delivers (it
seals the shards whose clock is not sealed that far, then reads them again): a marker write
that lands later fails, and the message goes at its old time only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Final

from delayq.records import DelayRequest

__all__ = [
    "ATTR_FLOOR",
    "ATTR_SEAL",
    "BUCKETS_PER_SHARD",
    "CLOCK_PK_PREFIX",
    "FLOOR_MARGIN_SECONDS",
    "KIND_CLOCK",
    "ControlClock",
    "clock_key",
    "clock_of",
    "floor_for",
    "record_second",
    "shard_and_bucket",
]

CLOCK_PK_PREFIX: Final = "clock#"
CLOCK_SK: Final = "-"
KIND_CLOCK: Final = "clock"
# Buckets per shard: an item of them all stays under 1 KB, so that raising one costs one write
# unit and reading a shard's clock one read unit.
BUCKETS_PER_SHARD: Final = 96
ATTR_FLOOR: Final = "f"
BUCKET_ATTR_PREFIX: Final = "b"
# A clock created after markers were written (an upgraded stack) counts every control up to
# this long after its creation: markers older than the clock carry record times up to then.
FLOOR_MARGIN_SECONDS: Final = 3600
# The latest release second sealed: by an emitter about to read the markers of stored
# messages released up to it, or by ingest before it refuses a reschedule as too late.
ATTR_SEAL: Final = "z"


def clock_key(shard: int) -> dict[str, Any]:
    """The key of one shard's clock item."""
    return {"pk": {"S": f"{CLOCK_PK_PREFIX}{shard}"}, "sk": {"S": CLOCK_SK}}


def _hash(delay_id: str) -> int:
    return zlib.crc32(delay_id.encode("utf-8"))


def shard_and_bucket(delay_id: str, shards: int) -> tuple[int, str]:
    """The shard of ``delay_id`` (``delayq.buckets.shard_of``) and its bucket's attribute."""
    digest = _hash(delay_id)
    return digest % shards, f"{BUCKET_ATTR_PREFIX}{digest // shards % BUCKETS_PER_SHARD}"


def record_second(ts_ms: int) -> int:
    """The second a clock keeps of a record timestamp."""
    return ts_ms // 1000


@dataclass(frozen=True)
class ControlClock:
    """One shard's clock: ``floor`` counts for every bucket, ``seconds`` holds the buckets
    some control raised."""

    floor: int
    seconds: dict[str, int] = field(default_factory=dict)
    # The latest release second sealed (0: none).
    sealed: int = 0

    def may_apply(self, request: DelayRequest, shards: int) -> bool:
        """Whether a control of ``request``'s id may apply to it: one written in or after its
        record's second (a copy keeps its original's record time, which is never later than
        the reschedule that made it)."""
        _, bucket = shard_and_bucket(request.delay_id, shards)
        latest = max(self.floor, self.seconds.get(bucket, 0))
        return latest >= record_second(request.ts_ms)


def clock_of(item: dict[str, Any]) -> ControlClock:
    """A clock item as read."""
    return ControlClock(
        int(item[ATTR_FLOOR]["N"]),
        {
            name: int(value["N"])
            for name, value in item.items()
            if name.startswith(BUCKET_ATTR_PREFIX) and name[1:].isdigit()
        },
        int(item[ATTR_SEAL]["N"]) if ATTR_SEAL in item else 0,
    )


def floor_for(now_ms: int) -> int:
    """The floor of a clock created at ``now_ms``."""
    return record_second(now_ms) + FLOOR_MARGIN_SECONDS
