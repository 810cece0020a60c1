"""The simulated world: one clock, one seeded random source, one queue of events, and the
invocations in flight, interleaved at every AWS call.

Each Lambda invocation runs in a thread of its own, but only one thread ever runs at a time:
the world hands a baton to the invocation whose next step is due, and takes it back at the
invocation's next AWS call or sleep. So two invocations interleave call by call (an ingest
write can land between a scheduler's announce and its Query), and the order is decided by the
event queue alone: the same seed gives the same history, byte for byte.

Time moves only between events. An AWS call costs a latency drawn from the knobs; a sleep
(the emitter holding a message to its due time, a back-off) costs what it asks for.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from delayq.retry import Deadline

Action = Callable[[], None]

# What the handlers keep back from their deadline (Deadline.from_context's default).
SAFETY_MS: Final = 2000


class Crash(BaseException):
    """The invocation's process dies here (a crash, or Lambda's timeout): a BaseException, so
    the layer's ``except Exception`` cannot catch it, as it could not catch a killed process."""


@dataclass
class Invocation:
    """One Lambda invocation in flight."""

    function: str
    started_ms: int
    timeout_ms: int
    number: int
    calls: int = 0

    @property
    def end_ms(self) -> int:
        """When Lambda kills it."""
        return self.started_ms + self.timeout_ms


class _Task(threading.Thread):
    """An invocation's thread; it runs only while it holds the baton."""

    def __init__(self, world: World, invocation: Invocation, body: Action) -> None:
        super().__init__(name=f"sim-{invocation.function}-{invocation.number}", daemon=True)
        self.world = world
        self.invocation = invocation
        self.body = body
        self.go = threading.Semaphore(0)

    def run(self) -> None:
        self.go.acquire()
        try:
            self.body()
        finally:
            self.world._running = None
            self.world._baton.release()


@dataclass
class World:
    """The clock, the event queue and the random source of one seeded run."""

    seed: int
    now_ms: int
    rng: random.Random = field(init=False)
    faults: Counter[str] = field(default_factory=Counter)
    history: list[str] = field(default_factory=list)
    _heap: list[tuple[int, int, Action]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _running: _Task | None = None
    _baton: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    _paused: set[_Task] = field(default_factory=set)
    _stopping: bool = False
    _until: int = 0  # the end of the current run_until

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # --- time and events ------------------------------------------------------------------

    def clock(self) -> int:
        """The true time, epoch milliseconds."""
        return self.now_ms

    def at(self, when_ms: int, action: Action) -> None:
        """Run ``action`` at ``when_ms`` (at once if that has passed), after everything
        already queued for that millisecond."""
        heapq.heappush(self._heap, (max(when_ms, self.now_ms), next(self._seq), action))

    def run_until(self, end_ms: int) -> None:
        """Process events in time order until none is left before ``end_ms``."""
        self._until = end_ms
        while self._heap and self._heap[0][0] <= end_ms:
            when, _, action = heapq.heappop(self._heap)
            self.now_ms = max(self.now_ms, when)
            action()
        self.now_ms = max(self.now_ms, end_ms)

    def note(self, text: str) -> None:
        """One line of the history (what the checker's report prints for a broken message)."""
        self.history.append(f"{self.now_ms} {text}")

    def chance(self, probability: float, fault: str) -> bool:
        """Draw a fault; count it when it happens."""
        if probability <= 0 or self.rng.random() >= probability:
            return False
        self.faults[fault] += 1
        return True

    # --- invocations ----------------------------------------------------------------------

    @property
    def invocation(self) -> Invocation | None:
        """The invocation holding the baton (None: the world itself, e.g. an event source)."""
        return self._running.invocation if self._running else None

    def invoke(self, function: str, timeout_s: float, body: Callable[[Invocation], None]) -> None:
        """Start an invocation now; it runs until its first AWS call or sleep, then
        interleaves with the others. ``body`` settles its own outcome (it sees
        :class:`Crash` like any exception)."""
        invocation = Invocation(function, self.now_ms, int(timeout_s * 1000), next(self._numbers))
        task = _Task(self, invocation, lambda: body(invocation))
        task.start()
        self._switch(task)

    def deadline(self, invocation: Invocation) -> Deadline:
        """The handler's deadline, on the simulated clock."""
        return Deadline(lambda: invocation.end_ms - self.now_ms, SAFETY_MS)

    def _switch(self, task: _Task) -> None:
        """Give the baton to ``task`` and wait until it hands it back."""
        self._running = task
        task.go.release()
        self._baton.acquire()

    def pause(self, ms: int) -> None:
        """The running invocation waits ``ms`` (an AWS call's latency, a sleep); the world
        goes on meanwhile. Outside an invocation, time simply moves."""
        task = self._running
        wake = self.now_ms + ms
        if task is None or (wake <= self._until and (not self._heap or self._heap[0][0] > wake)):
            # Nothing else happens meanwhile: no need to hand the baton over.
            self.now_ms += ms
            if self._stopping:
                raise Crash("the simulation ended")
            return
        self.at(self.now_ms + ms, lambda: self._resume(task))
        self._paused.add(task)
        self._running = None
        self._baton.release()
        task.go.acquire()
        self._running = task
        if self._stopping:
            raise Crash("the simulation ended")

    def _resume(self, task: _Task) -> None:
        self._paused.discard(task)
        self._switch(task)

    def sleep(self, seconds: float) -> None:
        """A sleep of the running invocation (never less than a millisecond)."""
        self.pause(max(1, round(seconds * 1000)))
        self.check_alive()

    def check_alive(self) -> None:
        """Lambda kills an invocation past its timeout: the next step never happens."""
        invocation = self.invocation
        if invocation is not None and self.now_ms >= invocation.end_ms:
            self.faults["lambda-timeout"] += 1
            raise Crash(f"{invocation.function} timed out")

    def stop(self) -> None:
        """End the run: every invocation still waiting dies where it waits (its thread
        ends), and no event runs any more."""
        self._stopping = True
        self._heap.clear()
        while self._paused:
            self._resume(min(self._paused, key=lambda t: t.invocation.number))
        self._heap.clear()
