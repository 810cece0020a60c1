"""`delayq tail`: deliveries on the target topics as they happen, with their lateness.

Every partition of the chosen topics is assigned (no consumer group: tailing commits nothing
and disturbs no other consumer), from the end, or from the beginning with `from_beginning`.
A record is shown from its delivery headers (`delay-id`, `delay-due-ms`, `delay-emitted-ms`,
`delay-attempt`); records without them were not written by the emitter and are counted apart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from delayq.settings import topic_allowed
from delayq_local.exceptions import LocalStackError
from delayq_local.observe import Delivery, delivery_of
from delayq_local.timefmt import iso_ms

_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Seen:
    """One delivery as the tail saw it: where it is, and its delivery headers."""

    delivery: Delivery
    partition: int
    offset: int

    @property
    def lateness_ms(self) -> int:
        """Emitted minus due (negative would be early: the product never does that)."""
        return self.delivery.emitted_ms - self.delivery.due_ms

    def as_json(self) -> dict[str, Any]:
        """One JSON line of `delayq tail --json`."""
        d = self.delivery
        return {
            "id": d.delay_id,
            "target": d.topic,
            "partition": self.partition,
            "offset": self.offset,
            "due_ms": d.due_ms,
            "emitted_ms": d.emitted_ms,
            "lateness_ms": self.lateness_ms,
            "attempt": d.attempt,
            "received_ms": d.received_ms,
        }

    def line(self) -> str:
        """One human line."""
        d = self.delivery
        return (
            f"{iso_ms(d.emitted_ms)}  {d.topic}[{self.partition}]@{self.offset}  id {d.delay_id}"
            f"  due {iso_ms(d.due_ms)}  late {self.lateness_ms} ms  attempt {d.attempt}"
        )


def choose_topics(
    existing: Iterable[str],
    explicit: Iterable[str] = (),
    allowed: Iterable[str] = (),
    exclude: Iterable[str] = (),
) -> list[str]:
    """The topics to tail: those named, else the cluster's topics the stack may deliver to
    (its allow-list; every non-internal topic when it is unknown), minus `exclude` (the delay
    topic)."""
    named = list(explicit)
    if named:
        return named
    patterns = list(allowed) or ["*"]
    skip = set(exclude)
    return sorted(t for t in existing if t not in skip and topic_allowed(t, patterns))


class Tail:
    """A consumer over every partition of `topics`."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: list[str],
        *,
        from_beginning: bool = False,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topics = topics
        self.unreadable = 0
        self._from = OFFSET_BEGINNING if from_beginning else OFFSET_END
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"delayq-tail-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                **(config or {}),
            }
        )

    @classmethod
    def existing_topics(
        cls, bootstrap_servers: str, config: Mapping[str, Any] | None = None, timeout: float = 10
    ) -> list[str]:
        """The cluster's topics."""
        probe = Consumer(
            {"bootstrap.servers": bootstrap_servers, "group.id": "delayq-tail", **(config or {})}
        )
        try:
            return sorted(probe.list_topics(timeout=timeout).topics)
        finally:
            probe.close()

    def start(self, timeout: float = 10.0) -> Tail:
        """Assign every partition of the topics (raises when none exists)."""
        metadata = self._consumer.list_topics(timeout=timeout)
        missing = [t for t in self.topics if t not in metadata.topics]
        if missing:
            raise LocalStackError(f"no such topic: {', '.join(missing)}")
        partitions = [
            TopicPartition(topic, partition, self._from)
            for topic in self.topics
            for partition in metadata.topics[topic].partitions
        ]
        if not partitions:
            raise LocalStackError("nothing to tail: no topic given and none found")
        self._consumer.assign(partitions)
        return self

    def follow(self, until: float | None = None) -> Iterator[Seen]:
        """Deliveries as they arrive, until the monotonic time `until` (None: for ever)."""
        while until is None or time.monotonic() < until:
            message = self._consumer.poll(_POLL_SECONDS)
            if message is None or message.error() is not None:
                continue
            try:
                delivery = delivery_of(message, int(time.time() * 1000))
            except (KeyError, ValueError):
                self.unreadable += 1
                continue
            yield Seen(delivery, message.partition() or 0, message.offset() or 0)

    def close(self) -> None:
        """Release the consumer."""
        self._consumer.close()
