"""The records' own order, and the rules of one id: which cancel or reschedule applies to which
message, whatever order the records are processed in (``docs/internals.md``, "one id")."""

from __future__ import annotations

from dataclasses import dataclass

from delayq.records import DelayRequest, RescheduleRequest

__all__ = [
    "Marker",
    "Position",
    "cancel_covers",
    "order_token",
    "position_of",
    "record_order",
    "version_order",
    "written_before",
]

Position = tuple[str, int, int]
"""``(topic, partition, offset)`` of a delay-topic record."""

# Widths that make :func:`order_token` strings sort as the orders they encode.
_TS_DIGITS = 16
_PARTITION_DIGITS = 10
_OFFSET_DIGITS = 20


def position_of(src: str) -> Position | None:
    """``(topic, partition, offset)`` of a ``topic-partition-offset`` source, else None."""
    head, _, offset = src.rpartition("-")
    topic, _, partition = head.rpartition("-")
    if not topic or not partition.isdigit() or not offset.isdigit():
        return None
    return topic, int(partition), int(offset)


def record_order(ts_ms: int, src: str) -> tuple[int, str, int, int]:
    """A total order of records: timestamp, then topic, partition and offset. Sources that are
    not coordinates sort by their text, before the coordinates of the same name."""
    position = position_of(src)
    if position is None:
        return ts_ms, src, -1, -1
    return ts_ms, *position


def order_token(ts_ms: int, src: str) -> str:
    """:func:`record_order` as a string that sorts the same way (DynamoDB compares strings in
    conditions; timestamps are never negative)."""
    ts, name, partition, offset = record_order(ts_ms, src)
    return (
        f"{ts:0{_TS_DIGITS}d}|{name}|"
        f"{partition + 1:0{_PARTITION_DIGITS}d}|{offset + 1:0{_OFFSET_DIGITS}d}"
    )


def version_order(request: DelayRequest) -> tuple[int, str, int, int]:
    """The order of the record a stored version comes from: the reschedule that made it, for
    a copy; else the message's own record."""
    if request.moved_src:
        return record_order(request.moved_ts_ms, request.moved_src)
    return record_order(request.ts_ms, request.src)


def written_before(ts: int, src: str, control_ts: int, control_src: str) -> bool:
    """Whether the message record ``(ts, src)`` was written before the control record.
    Timestamps decide; on the same millisecond, offsets on the same partition decide, and
    across partitions the control wins."""
    if ts != control_ts:
        return ts < control_ts
    mine, theirs = position_of(src), position_of(control_src)
    if mine is None or theirs is None or mine[:2] != theirs[:2]:
        return True
    return mine[2] < theirs[2]


def cancel_covers(cancel_ts: int, cancel_src: str, request: DelayRequest) -> bool:
    """Whether a cancel (its record's timestamp and coordinates) applies to ``request``: the
    message's record was written before the cancel's (:func:`written_before`). A message of
    unknown time (``ts_ms`` 0) is covered."""
    return written_before(request.ts_ms, request.src, cancel_ts, cancel_src)


@dataclass(frozen=True)
class Marker:
    """The control item of one id: its latest cancel and its latest reschedule, each as its
    record's ``(timestamp, coordinates)`` (None: none recorded), and where that reschedule
    moved the message to (``moved_due_ms``, for operators).

    A message is dropped when the cancel covers it, or when it is a version of the id written
    before the reschedule: the original messages written before it, and the copies earlier
    reschedules made. The copy this reschedule made is not, nor is a later message.
    """

    cancel: tuple[int, str] | None = None
    moved: tuple[int, str] | None = None
    moved_due_ms: int | None = None

    def applies(self, request: DelayRequest) -> bool:
        """Whether ``request`` must not be delivered."""
        return self.drops(request.ts_ms, request.src, request.moved_ts_ms, request.moved_src)

    def drops(self, ts_ms: int, src: str, moved_ts_ms: int = 0, moved_src: str = "") -> bool:
        """:meth:`applies` to a version known by its record (``ts_ms``, ``src``) and, for a
        copy, the reschedule that made it (``moved_ts_ms``, ``moved_src``)."""
        if self.cancel is not None and written_before(ts_ms, src, *self.cancel):
            return True
        if self.moved is None:
            return False
        if moved_src:
            return record_order(moved_ts_ms, moved_src) < record_order(*self.moved)
        return written_before(ts_ms, src, *self.moved)

    def rescheduled_by(self, reschedule: RescheduleRequest) -> bool:
        """Whether ``reschedule`` is the one recorded here."""
        return self.moved == (reschedule.ts_ms, reschedule.src)

    def superseded(self, reschedule: RescheduleRequest) -> bool:
        """Whether a reschedule written after ``reschedule`` is recorded here."""
        return self.moved is not None and record_order(
            reschedule.ts_ms, reschedule.src
        ) < record_order(*self.moved)
