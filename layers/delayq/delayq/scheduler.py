"""Timer and scheduler: move stored messages into the delay queue as they enter the horizon.

The scheduler is watermark-driven. Its progress is one item (:class:`delayq.store.Watermark`),
moved only by conditional writes: ``second``, the last due-second whose messages were all
sent, and, while the second after it is in progress, ``cursors``: for each of its unfinished
shards, the sort key of the last message sent. Each run queues the seconds after the
watermark up to now + look-ahead.

The ingest guard. Before its first Query a run records its whole window on the watermark
item (``reading``, a conditional write), and its Queries are strongly consistent. An ingest
that stored a message then reads the item (strongly consistent): if the message's second is
within a window a run may have read, ingest queues the message itself. Either the run's
record came before ingest's read (ingest sees it and queues), or ingest's write completed
before the run's Query (the run sees the message): no interleaving misses it, whatever the
clocks or timeouts (``docs/internals.md``).

Late seconds. TTL deletes a stored message from due + grace on. A second the run passes
after that point (less a margin for clocks, ``buckets.late_cutoff``) may have lost messages
to TTL before the run read them: its range is recorded on the watermark (``late``), and the
cleanup function re-drives every TTL removal in it. Expired messages that TTL has not deleted
yet are read and sent like the others: late, never dropped.

No watermark, no run: ingest creates the item, at a second below every due-second it
stores, before a stored message can be missed. A run that finds none has nothing to do.

Reading. The window is read ``QUERY_CHUNK_SECONDS`` seconds at a time: the first Query page
(``Settings.scheduler_page_items`` items) of every shard of those seconds, in parallel, so
that catching up empty or light seconds costs one round trip per chunk. A second whose pages
all end there is sent whole, and the watermark moves past it (one write per second that had
messages, one at the end of the run for the empty ones, and, while catching up, one every
``CATCH_UP_CHECKPOINT_SECONDS`` seconds passed). A crowded second goes round by
round: send the pages read, record the cursors, read the next page of every unfinished shard
in parallel, and so on. Memory holds one chunk's first pages or one round's pages, whatever
the size of the second.

Time. Before each read and each send the run checks that the time left (after the handler's
safety margin, which covers one last watermark write) exceeds its longest step so far. A run
that stops has recorded everything it sent; the next run resumes after the cursors.

Failures. A crash or a timeout re-sends at most the round in flight (one page per shard, with
the same ``delay-id``), never the whole second. Missed ticks are caught up by the next run; a
repeated tick finds the window done. Two runs at once: the loser fails its next conditional
write (see :meth:`delayq.store.MessageStore.write_watermark`) and stops; nothing is lost.

Why the progress lives on the watermark item rather than on one item per shard: one
conditional write records every shard of a round, and moving past the second (which clears
the cursors) is the same write that moves the watermark; per-shard items would need a
transaction for that, and a write per shard per round. The item holds one sort key per
unfinished shard: under 1 KB with typical ids, 16 KB at worst (16 shards of 1 KB ids).

Cancel markers are not read here. The emitter reads them for every batch it receives (it
must: short delays never pass through the store, and a cancel may arrive while a message
waits in the delay queue), so a cancelled long-delay message costs one SQS send here instead
of a marker read for every scheduled message.

Stored items are not deleted after scheduling: TTL (due + grace) removes them for free,
which saves one write per long-delay message, the largest cost line at volume.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from delayq import buckets
from delayq.clock import Clock
from delayq.exceptions import WatermarkConflictError
from delayq.queues import DelayQueue, TickQueue
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.store import MessageStore, Page, Watermark

__all__ = [
    "CATCH_UP_CHECKPOINT_SECONDS",
    "QUERY_CHUNK_SECONDS",
    "ScheduleResult",
    "fire_timer",
    "run_scheduler",
]

# Seconds read per round of parallel first-page queries (x shards partitions).
QUERY_CHUNK_SECONDS = 8
# A run catching up (after missed ticks, an outage) records its progress over empty seconds
# every this many seconds, so that a crash or timeout does not throw the whole catch-up away
# (found by the simulator: after an hour's outage, runs that kept dying re-read the same hour
# for up to an hour). Longer than a tick's window, so a run on time writes nothing more.
CATCH_UP_CHECKPOINT_SECONDS = 300


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
    # Progress writes before the run's end: after a round of a crowded second, and every
    # CATCH_UP_CHECKPOINT_SECONDS seconds passed while catching up.
    checkpoints: int = 0
    stopped_early: bool = False
    conflict: bool = False
    target_second: int = 0
    # Due-seconds passed after TTL may have started deleting their messages (see above).
    late_seconds: int = 0

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
    """Queue every stored message due from the watermark (and its cursors) to now +
    look-ahead, recording progress as it goes."""
    now_ms = clock()
    mark = store.read_watermark(deadline)
    if mark is None:
        # Nothing was ever stored (ingest creates the watermark before anything stored can
        # be missed): nothing to do.
        return ScheduleResult()
    window = buckets.scheduling_window(mark.second, now_ms, settings.lookahead_seconds)
    result = ScheduleResult(
        watermark_before=mark.second, watermark_after=mark.second, target_second=window.stop - 1
    )
    run = _Run(settings, store, delay_queue, clock, deadline, result, mark, now_ms)
    try:
        run.announce(window)
        run.schedule(window)
    except WatermarkConflictError:
        # Another run got ahead of us; it owns the window now. Nothing is lost: whatever we
        # sent is also the other run's to send (duplicates carry the same delay-id).
        result.conflict = True
    result.watermark_after = run.mark.second
    return result


@dataclass
class _Run:
    """One scheduler invocation: its adapters, its progress as last written, its timing."""

    settings: Settings
    store: MessageStore
    delay_queue: DelayQueue
    clock: Clock
    deadline: Deadline
    result: ScheduleResult
    mark: Watermark
    step_started_ms: int
    longest_step_ms: int = 0

    def announce(self, window: range) -> None:
        """Record the window on the watermark before reading any of it (the ingest guard)."""
        last = window.stop - 1
        reading = self.mark.reading if self.mark.reading is not None else self.mark.second
        if last > reading:
            self._write(self.mark.second, self.mark.cursors, reading=last)

    def schedule(self, window: range) -> None:
        """Send the window's seconds in order until done, out of time, or overtaken."""
        done = window.start - 1
        for second, pages in self._first_pages(window):
            if not (self._time_left() and self._finish(second, pages)):
                break
            done = second
            if done - self.mark.second >= CATCH_UP_CHECKPOINT_SECONDS:
                # A long catch-up keeps what it passed: a crash loses at most this much.
                self._write(done, {})
                self.result.checkpoints += 1
        self.result.stopped_early = done < self.result.target_second
        # Empty seconds are passed in one write at the end.
        if self.mark.second < done:
            self._write(done, {})

    def _first_pages(self, window: range) -> Iterator[tuple[int, list[Page]]]:
        """The window's seconds in order with the first page of each shard still to read,
        read ``QUERY_CHUNK_SECONDS`` seconds at a time (lazily: a run that stops reads no
        further)."""
        for first in range(window.start, window.stop, QUERY_CHUNK_SECONDS):
            if not self._time_left():
                return
            chunk = range(first, min(first + QUERY_CHUNK_SECONDS, window.stop))
            pages = self._read([start for second in chunk for start in self._starts(second)])
            by_second: dict[int, list[Page]] = {second: [] for second in chunk}
            for page in pages:
                by_second[buckets.parse_bucket_key(page.pk)[0]].append(page)
            yield from by_second.items()

    def _starts(self, second: int) -> list[tuple[str, str | None]]:
        """Where each shard of ``second`` is to be read from: after the recorded cursors
        when a run stopped inside it (finished shards are not listed), else from the top."""
        if self.mark.cursors and second == self.mark.second + 1:
            return list(self.mark.cursors.items())
        return [(pk, None) for pk in buckets.bucket_keys(second, self.settings.shards)]

    def _finish(self, second: int, pages: list[Page]) -> bool:
        """Send ``second`` from its first pages on, round by round, recording the cursors
        after each round that leaves more; True when the whole second is sent."""
        resumed = bool(self.mark.cursors)
        sent_before = self.result.sent
        while True:
            messages = [m for page in pages for m in page.messages]
            if messages:
                self.delay_queue.send(messages, self.clock(), self.deadline)
                self.result.sent += len(messages)
            cursors = {p.pk: p.last_key for p in pages if p.last_key is not None}
            if not cursors:
                break
            self._write(second - 1, cursors)
            self.result.checkpoints += 1
            if not self._time_left():
                return False
            pages = self._read(list(cursors.items()))
        if resumed or self.result.sent > sent_before:
            self._write(second, {})
        self.result.seconds_scanned += 1
        return True

    def _read(self, starts: list[tuple[str, str | None]]) -> list[Page]:
        return self.store.query_pages(
            starts, self.settings.scheduler_page_items, self.clock(), self.deadline
        )

    def _write(
        self, second: int, cursors: Mapping[str, str], *, reading: int | None = None
    ) -> None:
        """Record progress; seconds passed by this write that TTL may have reached first are
        added to the late ranges."""
        now_ms = self.clock()
        late = self.mark.late
        if second > self.mark.second:
            grace = self.settings.ttl_grace_seconds
            cutoff = buckets.late_cutoff(now_ms, grace, self.settings.ttl_clock_margin_seconds)
            late = buckets.add_late(
                late,
                self.mark.second + 1,
                second,
                cutoff=cutoff,
                now_ms=now_ms,
                ttl_grace_seconds=grace,
            )
            self.result.late_seconds += max(0, min(second, cutoff) - self.mark.second)
        self.mark = self.store.write_watermark(
            self.mark, Watermark(second, cursors, reading=reading, late=late), now_ms, self.deadline
        )

    def _time_left(self) -> bool:
        """Whether another step fits: the time left must exceed the longest step so far
        (each call ends one step: a chunk read, a second sent, or a round)."""
        now_ms = self.clock()
        self.longest_step_ms = max(self.longest_step_ms, now_ms - self.step_started_ms)
        self.step_started_ms = now_ms
        return self.deadline.remaining_seconds() * 1000 > self.longest_step_ms
