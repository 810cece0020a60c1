"""Timer and scheduler: move stored messages into the delay queue as they enter the horizon.

The scheduler is watermark-driven. The watermark (one item, moved by conditional write) is
the last due-second whose messages were all sent. Each run queues every second after it up to
now + look-ahead, advancing the watermark after each second that had messages (and once at
the end for empty seconds). Missed ticks are caught up by the next run; a repeated tick finds
the window already done; a crash re-sends at most one second's messages (same ``delay-id``).

Stored items are not deleted after scheduling: TTL (due + grace) removes them for free,
which saves one write per long-delay message, the largest cost line at volume.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from delayq import buckets
from delayq.clock import Clock
from delayq.contract import DelayRequest
from delayq.exceptions import WatermarkConflictError
from delayq.queues import DelayQueue, TickQueue
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import MessageStore

# Seconds read per round of parallel queries (x shards partitions).
QUERY_CHUNK_SECONDS = 8


def fire_timer(
    *, tick_queue: TickQueue, settings: Settings, clock: Clock, deadline: Deadline
) -> str:
    """Put this period's tick on the FIFO queue (idempotent: same dedup id per period)."""
    now_ms = clock()
    return tick_queue.put_tick(
        buckets.tick_index(now_ms, settings.tick_seconds), settings.tick_seconds, now_ms, deadline
    )


@dataclass
class ScheduleResult:
    """What one run did."""

    watermark_before: int | None = None
    watermark_after: int | None = None
    seconds_scanned: int = 0
    sent: int = 0
    skipped_cancelled: int = 0
    stopped_early: bool = False
    conflict: bool = False
    target_second: int = 0

    @property
    def lag_seconds(self) -> int:
        """How far the watermark trails the window end this run aimed at (0 = caught up)."""
        return max(0, self.target_second - (self.watermark_after or 0))


def run_scheduler(
    *,
    settings: Settings,
    store: MessageStore,
    delay_queue: DelayQueue,
    clock: Clock,
    deadline: Deadline,
) -> ScheduleResult:
    """Queue every stored message due from the watermark to now + look-ahead."""
    now_ms = clock()
    stored = store.get_watermark(deadline)
    # First run ever: nothing can be stored below now + horizon, so start just before now.
    start = stored if stored is not None else buckets.due_second(now_ms) - 1
    window = buckets.scheduling_window(start, now_ms, settings.lookahead_seconds)
    result = ScheduleResult(
        watermark_before=stored, watermark_after=stored, target_second=window.stop - 1
    )
    written, reached = stored, start
    try:
        for second, messages in _due_messages(store, window, clock, deadline):
            if deadline.expired():
                break
            result.seconds_scanned += 1
            if messages:
                cancelled = store.cancelled([m.delay_id for m in messages], deadline)
                live = [m for m in messages if m.delay_id not in cancelled]
                if live:
                    delay_queue.send(live, clock(), deadline)
                result.sent += len(live)
                result.skipped_cancelled += len(messages) - len(live)
                store.advance_watermark(written, second, clock(), deadline)
                written = second
            reached = second
        result.stopped_early = reached < result.target_second
        if reached != written:
            store.advance_watermark(written, reached, clock(), deadline)
            written = reached
    except WatermarkConflictError:
        # Another run got ahead of us; it owns the window now. Nothing is lost: whatever we
        # sent is also the other run's to send (duplicates carry the same delay-id).
        result.conflict = True
    result.watermark_after = written
    return result


def _due_messages(
    store: MessageStore, window: range, clock: Clock, deadline: Deadline
) -> Iterator[tuple[int, list[DelayRequest]]]:
    """The window's seconds in order with their messages, read ``QUERY_CHUNK_SECONDS`` at a
    time so that catching up after an outage is not one round trip per second."""
    for start in range(window.start, window.stop, QUERY_CHUNK_SECONDS):
        if deadline.expired():
            return
        chunk = range(start, min(start + QUERY_CHUNK_SECONDS, window.stop))
        found = store.query_seconds(chunk, clock(), deadline)
        yield from ((second, found[second]) for second in chunk)
