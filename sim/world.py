"""The simulated world: one clock, one seeded random source, one queue of events, and the
invocations in flight, interleaved at every AWS call.

Each Lambda invocation runs in a greenlet of its own (a coroutine with its own stack, so the
layer's ordinary blocking code runs unchanged), and only one ever runs at a time: the world
switches to the invocation whose next step is due, and the invocation switches back at its
next AWS call or sleep. So two invocations interleave call by call (an ingest
write can land between a scheduler's announce and its Query), and the order is decided by the
event queue alone: the same seed gives the same history, byte for byte.

Time moves only between events. An AWS call costs a latency drawn from the knobs; a sleep
(the emitter holding a message to its due time, a back-off) costs what it asks for.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from greenlet import greenlet  # type: ignore[import-untyped]  # no stubs published

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


class _Task(greenlet):  # type: ignore[misc]  # greenlet ships no stubs for subclassing
    """An invocation's coroutine; it runs only while the world has switched to it."""

    def __init__(self, world: World, invocation: Invocation, body: Action) -> None:
        super().__init__(parent=greenlet.getcurrent())
        self.world = world
        self.invocation = invocation
        self.body = body

    def run(self) -> None:
        try:
            self.body()
        except Crash:
            pass  # the invocation died where it stood (the world is stopping)
        finally:
            self.world._running = None


@dataclass
class World:
    """The clock, the event queue and the random source of one seeded run."""

    seed: int
    now_ms: int
    rng: random.Random = field(init=False)
    # A second stream, for knobs added later: turning one up leaves ``rng``'s draws as they were.
    side_rng: random.Random = field(init=False)
    _streams: dict[str, random.Random] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    history: list[str] = field(default_factory=list)
    _heap: list[tuple[int, int, Action]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _running: _Task | None = None
    _paused: set[_Task] = field(default_factory=set)
    _stopping: bool = False
    _until: int = 0  # the end of the current run_until
    _random: Callable[[], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.side_rng = random.Random(f"side-{self.seed}")
        self._random = self.rng.random  # chance() draws half a million times a seed

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

    def stream(self, name: str) -> random.Random:
        """A random stream of its own for ``name`` (knobs added later draw from one, so that
        turning them on leaves the others' draws as they were)."""
        found = self._streams.get(name)
        if found is None:
            found = self._streams[name] = random.Random(f"{name}-{self.seed}")
        return found

    def note(self, text: str) -> None:
        """One line of the history (what the checker's report prints for a broken message)."""
        self.history.append(f"{self.now_ms} {text}")

    def chance(self, probability: float, fault: str) -> bool:
        """Draw a fault; count it when it happens (no draw when it cannot happen)."""
        if probability <= 0 or self._random() >= probability:
            return False
        self.faults[fault] += 1
        return True

    def draw_between(self, low: int, high: int) -> Callable[[], int]:
        """``rng.randint(low, high)`` as a function of no argument, drawing exactly as it
        draws (``randint`` is ``low + _randbelow(high - low + 1)``, after checks made once
        here): every simulated call draws its latency."""
        if not (isinstance(low, int) and isinstance(high, int) and high >= low):
            return partial(self.rng.randint, low, high)  # randint's own errors, each draw
        below = self.rng._randbelow  # type: ignore[attr-defined]  # CPython's, no stub
        width = high - low + 1
        return lambda: low + below(width)

    # --- invocations ----------------------------------------------------------------------

    @property
    def invocation(self) -> Invocation | None:
        """The invocation running now (None: the world itself, e.g. an event source)."""
        return self._running.invocation if self._running else None

    def invoke(self, function: str, timeout_s: float, body: Callable[[Invocation], None]) -> None:
        """Start an invocation now; it runs until its first AWS call or sleep, then
        interleaves with the others. ``body`` settles its own outcome (it sees
        :class:`Crash` like any exception)."""
        invocation = Invocation(function, self.now_ms, int(timeout_s * 1000), next(self._numbers))
        self._switch(_Task(self, invocation, lambda: body(invocation)))

    def deadline(self, invocation: Invocation) -> Deadline:
        """The handler's deadline, on the simulated clock."""
        return Deadline(lambda: invocation.end_ms - self.now_ms, SAFETY_MS)

    def _switch(self, task: _Task) -> None:
        """Run ``task`` until its next pause, or its end."""
        self._running = task
        task.switch()

    def pause(self, ms: int) -> None:
        """The running invocation waits ``ms`` (an AWS call's latency, a sleep); the world
        goes on meanwhile. Outside an invocation, time simply moves."""
        task = self._running
        wake = self.now_ms + ms
        if task is None or (wake <= self._until and (not self._heap or self._heap[0][0] > wake)):
            # Nothing else happens meanwhile: no need to switch.
            self.now_ms += ms
            if self._stopping:
                raise Crash("the simulation ended")
            return
        self.at(self.now_ms + ms, lambda: self._resume(task))
        self._paused.add(task)
        self._running = None
        task.parent.switch()
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
        """End the run: every invocation still waiting dies where it waits (its coroutine
        ends), and no event runs any more."""
        self._stopping = True
        self._heap.clear()
        while self._paused:
            self._resume(min(self._paused, key=lambda t: t.invocation.number))
        self._heap.clear()
