"""Lambda's side of the pipeline: each function's execution environments and its invocation.

An invocation runs in a container of its function (one per concurrent invocation, reused,
each with its own clients, producer and clock skew, like Lambda's execution environments).
Lambda may throttle an invocation: it never runs, and its event source retries as it does
after a failure. A process that dies takes its container with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

from delayq.direct import DirectServices
from delayq.exceptions import OutOfTimeError
from delayq.ingest import IngestServices
from delayq.kafka import KafkaDelivery
from delayq.payloads import PayloadStore
from delayq.pending import PendingCounts
from delayq.queues import DelayQueue, RejectQueue, TickQueue
from delayq.shaping import Shaper
from delayq.stats import DeliveryStats
from delayq.store import MessageStore
from sim.faults import Knobs, RetryLedger
from sim.world import Crash, Invocation, World

# From template.yaml: each function's timeout.
TIMEOUT_S: Final = {
    "ingest": 60,
    "timer": 10,
    "scheduler": 60,
    "emitter": 30,
    "cleanup": 60,
    "operator": 3_600,  # not a function: ``delayq redrive`` on an operator's machine
}


@dataclass
class Container:
    """One execution environment: clients (faulty), adapters, a producer, a skewed clock."""

    clock: Callable[[], int]
    store: MessageStore
    payloads: PayloadStore
    delay_queue: DelayQueue
    dead_letters: DelayQueue
    rejects: RejectQueue
    tick_queue: TickQueue
    delivery: KafkaDelivery
    stats: DeliveryStats
    pending: PendingCounts
    # The tenant limits' counters (None: no tenant has a limit), as ``delayq.runtime`` has
    # them: ingest's release slots and quotas, the emitter's slots for late capped messages.
    shaper: Shaper | None

    def ingest_services(self) -> IngestServices:
        """What ingest (and a redrive re-ingesting rejects) uses in this environment."""
        return IngestServices(
            self.store,
            self.delay_queue,
            self.rejects,
            self.payloads,
            direct=DirectServices(self.delivery, self.stats),
            shaper=self.shaper,
            pending=self.pending,
        )


class _Containers:
    """A function's execution environments: one per concurrent invocation, reused."""

    def __init__(self, build: Callable[[], Container]) -> None:
        self._build = build
        self._idle: list[Container] = []

    def take(self) -> Container:
        return self._idle.pop() if self._idle else self._build()

    def give_back(self, container: Container) -> None:
        self._idle.append(container)


class Functions:
    """The five functions as Lambda runs them: containers built by ``build(function)``,
    invocations counted, transient errors an invocation leaves behind settled in the
    retry ledger when it ends."""

    def __init__(
        self,
        world: World,
        knobs: Knobs,
        retries: RetryLedger,
        build: Callable[[str], Container],
    ) -> None:
        self.world = world
        self.knobs = knobs
        self.retries = retries
        self.invocations: dict[str, int] = dict.fromkeys(TIMEOUT_S, 0)
        # What the invocation that just failed raised (None when it died), for ``done``.
        self.last_failure: Exception | None = None
        self._containers = {f: _Containers(partial(build, f)) for f in TIMEOUT_S}

    def invoke(
        self,
        function: str,
        body: Callable[[Container, Invocation], None],
        done: Callable[[bool], None],
    ) -> None:
        """Run ``body`` in a container of ``function``; ``done(ok)`` settles the event. Lambda
        may throttle the invocation (no concurrency left): it never runs, and the event source
        retries as it does after a failure."""
        if self.world.chance(self.knobs.lambda_throttled, "lambda-throttled"):
            self.world.note(f"{function} invocation throttled")
            self.world.at(self.world.now_ms, lambda: done(False))
            return
        self.invocations[function] += 1
        containers = self._containers[function]
        container = containers.take()

        def run(invocation: Invocation) -> None:
            ok = alive = False
            self.last_failure = None
            try:
                body(container, invocation)
                self.world.check_alive()
                ok = alive = True
            except Crash as e:
                self.world.note(f"{function} #{invocation.number} died: {e}")
            except Exception as e:  # noqa: BLE001 -- the invocation failed: the source retries
                self.world.note(f"{function} #{invocation.number} failed: {type(e).__name__}: {e}")
                self.last_failure = e
                alive = True
            self.retries.ended(
                invocation, killed=not alive, out_of_time=_out_of_time(self.last_failure)
            )
            if alive:  # a dead process takes its container with it
                containers.give_back(container)
            done(ok)

        self.world.invoke(function, TIMEOUT_S[function], run)


def _out_of_time(error: BaseException | None) -> bool:
    """Whether ``error`` (or what it was raised from) is the layer running out of its time."""
    while error is not None:
        if isinstance(error, OutOfTimeError):
            return True
        error = error.__cause__ or error.__context__
    return False
