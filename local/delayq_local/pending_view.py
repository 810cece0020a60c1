"""`delayq pending`: what waits, per minute, hour or day and target, for the next days.

Read from the counts ingest keeps (``delayq.pending``: a Query per UTC day, no table scan),
the scheduler's watermark (how far stored messages have been handed to the delay queue) and
SQS's approximate counts of the delay queues (bundles, not messages).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from delayq import buckets
from delayq.pending import MINUTES_PER_DAY, PendingCount, PendingCounts, minute_of
from delayq.retry import Deadline
from delayq.store import MessageStore

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["PERIOD_MINUTES", "PendingReport", "QueueDepth", "group_counts", "pending_report"]

# Period lengths (minutes) by name; counts are kept in these and shown in them.
PERIOD_MINUTES: Final = {"minute": 1, "hour": 60, "day": MINUTES_PER_DAY}

# SQS's approximate counts of a queue: messages (here: bundles) waiting, in flight, delayed.
_QUEUE_ATTRIBUTES: Final = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
_CAVEATS: Final = (
    "counts are what ingest kept, less what reschedules moved away, per minute for messages "
    "sent up to an hour ahead, per hour up to a day ahead, per day beyond; a cancelled message "
    "is counted until its period passes, and messages due within the direct window (delivered "
    "at once) are not counted"
)


@dataclass(frozen=True)
class QueueDepth:
    """SQS's approximate counts of one delay queue (bundles of messages, not messages)."""

    url: str
    visible: int
    in_flight: int
    delayed: int


@dataclass(frozen=True)
class PendingReport:
    """The answer of `delayq pending`."""

    by: str
    target: str | None
    first_minute: int
    last_minute: int
    rows: Sequence[PendingCount]
    watermark_second: int | None
    now_ms: int
    queues: Sequence[QueueDepth] = field(default_factory=tuple)

    @property
    def stored(self) -> int:
        return sum(r.stored for r in self.rows)

    @property
    def queued(self) -> int:
        return sum(r.queued for r in self.rows)

    def scheduler_behind_seconds(self) -> int | None:
        """How far the watermark trails now (None: no scheduler run yet)."""
        if self.watermark_second is None:
            return None
        return max(0, buckets.due_second(self.now_ms) - self.watermark_second)

    def as_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "target": self.target,
            "from": _iso(self.first_minute * 60_000),
            "until": _iso((self.last_minute + 1) * 60_000),
            "rows": [
                {
                    "start": _iso(r.minute * 60_000),
                    "minutes": r.minutes,
                    "target": r.target,
                    "stored": r.stored,
                    "queued": r.queued,
                    "total": r.total,
                }
                for r in self.rows
            ],
            "stored": self.stored,
            "queued": self.queued,
            "total": self.stored + self.queued,
            "scheduler_watermark": (
                None if self.watermark_second is None else _iso(self.watermark_second * 1000)
            ),
            "scheduler_behind_seconds": self.scheduler_behind_seconds(),
            "delay_queues": [q.__dict__ for q in self.queues],
            "caveats": _CAVEATS,
        }

    def lines(self) -> list[str]:
        width = max([len("target"), *(len(r.target) for r in self.rows)])
        scope = f" for {self.target}" if self.target else ""
        lines = [
            f"pending per {self.by}{scope}, {_iso(self.first_minute * 60_000)} to "
            f"{_iso((self.last_minute + 1) * 60_000)}",
            f"  {self.by + ' (UTC)':<22}  {'target':<{width}}  {'stored':>9}  {'queued':>9}  "
            f"{'total':>9}",
        ]
        lines.extend(
            f"  {_period(r, self.by):<22}  {r.target:<{width}}  {r.stored:>9,}  "
            f"{r.queued:>9,}  {r.total:>9,}"
            for r in self.rows
        )
        if not self.rows:
            lines.append("  nothing waits")
        lines.append(
            f"  {'total':<22}  {'':<{width}}  {self.stored:>9,}  {self.queued:>9,}  "
            f"{self.stored + self.queued:>9,}"
        )
        behind = self.scheduler_behind_seconds()
        if behind is None:
            lines.append("scheduler: no run yet")
        else:
            assert self.watermark_second is not None
            lines.append(
                f"scheduler: stored messages handed to the delay queue through "
                f"{_iso(self.watermark_second * 1000)} ({behind:,} s behind now)"
            )
        for q in self.queues:
            lines.append(
                f"delay queue {q.url.rsplit('/', 1)[-1]}: about {q.delayed:,} bundles delayed, "
                f"{q.visible:,} ready, {q.in_flight:,} being delivered (SQS approximate counts)"
            )
        lines.append(f"note: {_CAVEATS}")
        return lines


def group_counts(
    counts: Iterable[PendingCount], by: str, target: str | None = None
) -> list[PendingCount]:
    """Counts summed per period of ``by`` (``minute``, ``hour`` or ``day``) and target, in
    period then target order; only ``target``'s when given. A count kept for a longer period
    than ``by`` (an hour or a day: messages sent far ahead) stays whole, as its own row.
    Periods whose count is 0 (every message moved away) are left out."""
    size = PERIOD_MINUTES[by]
    sums: dict[tuple[int, int, str], list[int]] = defaultdict(lambda: [0, 0])
    for count in counts:
        if target is not None and count.target != target:
            continue
        length = max(size, count.minutes)
        pair = sums[(count.minute - count.minute % length, length, count.target)]
        pair[0] += count.stored
        pair[1] += count.queued
    return [
        PendingCount(start, length, name, stored, queued)
        for (start, length, name), (stored, queued) in sorted(sums.items())
        if stored or queued
    ]


def pending_report(
    counts: PendingCounts,
    store: MessageStore,
    sqs: SQSClient | None,
    queue_urls: Sequence[str],
    *,
    now_ms: int,
    days: int,
    by: str,
    target: str | None,
    deadline: Deadline,
) -> PendingReport:
    """Counts from the current minute for ``days`` days, grouped ``by`` (minute, hour, day)."""
    if by not in PERIOD_MINUTES:
        raise ValueError(f"by must be one of {', '.join(PERIOD_MINUTES)}, not {by!r}")
    first = minute_of(now_ms)
    last = first + days * 1440 - 1
    rows = group_counts(counts.read(first, last, deadline), by, target)
    mark = store.read_watermark(deadline)
    queues = [_depth(sqs, url) for url in queue_urls] if sqs is not None else []
    return PendingReport(
        by=by,
        target=target,
        first_minute=first,
        last_minute=last,
        rows=rows,
        watermark_second=None if mark is None else mark.second,
        now_ms=now_ms,
        queues=queues,
    )


def _depth(sqs: SQSClient, url: str) -> QueueDepth:
    response = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(_QUEUE_ATTRIBUTES))
    values: Mapping[Any, str] = response.get("Attributes", {})
    visible, in_flight, delayed = (int(values.get(name, "0")) for name in _QUEUE_ATTRIBUTES)
    return QueueDepth(url, visible, in_flight, delayed)


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


def _period(row: PendingCount, by: str) -> str:
    """The period's start; a row kept for longer than ``by`` (messages sent far ahead are
    counted per hour or day) says so."""
    moment = datetime.fromtimestamp(row.minute * 60, UTC)
    if row.minutes >= PERIOD_MINUTES["day"]:
        text = moment.strftime("%Y-%m-%d")
        return text if by == "day" else f"{text} (whole day)"
    text = moment.strftime("%Y-%m-%d %H:%M")
    return text if row.minutes <= PERIOD_MINUTES[by] else f"{text} (whole hour)"
