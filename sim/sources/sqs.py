"""What Lambda's SQS event sources share: pollers that call SQS with the function's role,
and that look at their queue again when its next message becomes visible."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from typing import ClassVar

from delayq.settings import Settings
from sim.faults import Knobs
from sim.functions import Functions
from sim.iam import Roles
from sim.world import World
from testkit.aws import FakeSqs


@dataclass(eq=False)
class QueuePoller(ABC):
    """The event source of one queue (``url``) for one function; ``poll`` is its look at the
    queue. Subclasses name the function and add their own state as fields with defaults."""

    function: ClassVar[str]
    window_ms: ClassVar[int] = 0  # the batching window after a message becomes visible

    world: World
    knobs: Knobs
    settings: Settings
    functions: Functions
    _: KW_ONLY
    sqs: FakeSqs
    roles: Roles
    url: str
    _next_look: int | None = field(default=None, init=False, repr=False)

    @abstractmethod
    def poll(self) -> None:
        """Receive from the queue and invoke the function, or wait for a message."""

    def may(self, operation: str) -> bool:
        """Lambda's pollers call SQS with the function's execution role: IAM checks them too
        (a refused poll leaves the messages where they are)."""
        denial = self.roles.guard.check(self.function, "sqs", operation, {"QueueUrl": self.url})
        if denial is not None:
            self.world.faults["iam-denied"] += 1
        return denial is None

    def wake(self) -> None:
        """Look at the queue again when its next message becomes visible (after the batching
        window): one pending look, the earliest needed."""
        visible = self.sqs.next_visible_ms(self.url)
        if visible is None:
            return
        when = max(visible, self.world.now_ms) + (
            self.world.rng.randint(0, self.window_ms) if self.window_ms else 0
        )
        if self._next_look is not None and self._next_look <= when:
            return
        self._next_look = when
        self.world.at(when, partial(self._looked, when))

    def _looked(self, when: int) -> None:
        if self._next_look == when:
            self._next_look = None
        self.poll()
