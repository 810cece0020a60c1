"""EventBridge -> timer -> SQS FIFO tick queue -> scheduler.

- EventBridge (timer): one event per period, late within the period, sometimes missed or
  twice; a failed asynchronous invocation is retried twice.
- SQS FIFO (scheduler): one tick at a time; a failed tick comes back after the visibility
  timeout, and goes to the dead-letter queue after ``maxReceiveCount`` receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Final

from delayq.scheduler import fire_timer, run_scheduler
from sim.functions import Container
from sim.sources.sqs import QueuePoller
from sim.world import Invocation

# From template.yaml: the tick queue's visibility timeout and receive count, the timer's
# asynchronous retries.
TICK_VISIBILITY_S: Final = 360
TICK_MAX_RECEIVES: Final = 5
TIMER_RETRIES: Final = 2


@dataclass(frozen=True)
class SchedulerRun:
    """A scheduler run that returned: when it started and ended, and the last due-second it
    had released (its watermark) when it ended."""

    started_ms: int
    ended_ms: int
    watermark: int


@dataclass(eq=False)
class Ticks(QueuePoller):
    """The timer's schedule and the tick queue's event source. ``down`` is the scheduler's
    outage, ``(from, until)``, the run may plant (every invocation in it fails); ``runs`` the
    scheduler runs that returned."""

    function: ClassVar[str] = "scheduler"

    down: tuple[int, int] = field(default=(0, 0), init=False)
    runs: list[SchedulerRun] = field(default_factory=list, init=False)
    _ticking: bool = field(default=False, init=False)

    def start(self, until_ms: int) -> None:
        """EventBridge's events, one a period, from the next period until ``until_ms``."""
        period = self.settings.tick_seconds * 1000
        first = (self.world.now_ms // period + 1) * period
        for start in range(first, until_ms, period):
            self._schedule_tick(start)

    def _schedule_tick(self, period_start_ms: int) -> None:
        world, knobs = self.world, self.knobs
        if world.chance(knobs.tick_missed, "tick-missed"):
            return
        copies = 2 if world.chance(knobs.tick_duplicated, "tick-duplicated") else 1
        for _ in range(copies):
            late = world.rng.randint(0, knobs.tick_late_ms) if knobs.tick_late_ms else 0
            world.at(period_start_ms + late, lambda: self._timer(TIMER_RETRIES))

    def _timer(self, retries_left: int) -> None:
        def body(cn: Container, invocation: Invocation) -> None:
            fire_timer(
                tick_queue=cn.tick_queue,
                settings=self.settings,
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
            )

        def done(ok: bool) -> None:
            if not ok and retries_left:
                # Asynchronous invocation: retried after a minute, then two.
                wait = 60_000 * (TIMER_RETRIES - retries_left + 1)
                self.world.at(self.world.now_ms + wait, lambda: self._timer(retries_left - 1))

        self.functions.invoke("timer", body, done)

    def poll(self) -> None:
        """Invoke the scheduler with the next tick, unless one is under way."""
        if self._ticking:
            return
        url = self.url
        if not self.may("ReceiveMessage"):
            return
        got = self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=TICK_VISIBILITY_S
        )
        messages = got.get("Messages", [])
        if not messages:
            self.wake()
            return
        message = messages[0]
        if int(message["Attributes"]["ApproximateReceiveCount"]) > TICK_MAX_RECEIVES:
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            self.world.faults["tick-dead-lettered"] += 1
            self.world.at(self.world.now_ms, self.poll)
            return
        self._ticking = True

        def body(cn: Container, invocation: Invocation) -> None:
            start, end = self.down
            if start <= self.world.now_ms < end:
                self.world.faults["scheduler-down"] += 1
                raise RuntimeError("the scheduler is down (outage knob)")
            result = run_scheduler(
                settings=self.settings,
                store=cn.store,
                delay_queue=cn.delay_queue,
                clock=cn.clock,
                deadline=self.world.deadline(invocation),
            )
            if result.watermark_after is not None:
                run = SchedulerRun(invocation.started_ms, self.world.now_ms, result.watermark_after)
                self.runs.append(run)

        def done(ok: bool) -> None:
            self._ticking = False
            if ok and self.may("DeleteMessage"):
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            self.world.at(self.world.now_ms, self.poll)

        self.functions.invoke("scheduler", body, done)
