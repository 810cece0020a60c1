"""What Lambda's SQS event sources share: pollers that call SQS with the function's role,
and that look at their queue again when its next message becomes visible."""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import ClassVar

from sim.iam import Roles
from sim.world import World
from testkit.aws import FakeSqs


class QueuePoller(ABC):
    """The event source of one queue for one function; ``poll`` is its look at the queue."""

    window_ms: ClassVar[int] = 0  # the batching window after a message becomes visible

    def __init__(self, world: World, sqs: FakeSqs, roles: Roles, function: str, url: str) -> None:
        self.world = world
        self.sqs = sqs
        self.roles = roles
        self.function = function
        self.url = url
        self._next_look: int | None = None

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
