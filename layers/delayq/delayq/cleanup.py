"""Cleanup: the safety net behind TTL.

TTL removes a stored message at due + grace. If the scheduler never passed its due-second
(the watermark is behind it: the scheduler was stopped for longer than the grace), the
message was never queued: it is re-driven to the delay queue now (late, but not lost) and
counted. Otherwise it was scheduled long ago, and only its offloaded payload (if any) is
deleted. Only TTL removals count; a user's own delete is not a reason to deliver.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayq import buckets
from delayq import constants as c
from delayq.clock import Clock
from delayq.payloads import PayloadStore
from delayq.queues import DelayQueue
from delayq.retry import Deadline
from delayq.store import MessageStore, request_from_item


class Outcome(enum.Enum):
    """What happened to one stream record."""

    IGNORED = "ignored"  # not a TTL removal of a message
    REDRIVEN = "redriven"  # never scheduled: sent to the delay queue now
    CLEANED = "cleaned"  # scheduled before: offloaded payload deleted (if any)


def is_ttl_removal(record: Mapping[str, Any]) -> bool:
    """A REMOVE made by the DynamoDB service principal (TTL), not by a user."""
    identity = record.get("userIdentity") or {}
    return (
        record.get("eventName") == "REMOVE"
        and identity.get("type") == "Service"
        and identity.get("principalId") == c.TTL_PRINCIPAL
    )


@dataclass(frozen=True)
class CleanupServices:
    """The adapters the safety net uses."""

    store: MessageStore
    delay_queue: DelayQueue
    payloads: PayloadStore


class TtlCleanup:
    """Handles one stream batch; reads the watermark once, on first need."""

    def __init__(self, services: CleanupServices, *, clock: Clock, deadline: Deadline) -> None:
        self._store = services.store
        self._queue = services.delay_queue
        self._payloads = services.payloads
        self._clock = clock
        self._deadline = deadline
        self._watermark: int | None = None
        self._watermark_read = False

    def handle(self, record: Mapping[str, Any]) -> Outcome:
        """Process one stream record (raises on AWS failure, so the batch item is retried)."""
        image = (record.get("dynamodb") or {}).get("OldImage") or {}
        if not is_ttl_removal(record) or image.get("kind", {}).get("S") != c.KIND_MESSAGE:
            return Outcome.IGNORED
        request = request_from_item(image)
        watermark = self._current_watermark()
        if watermark is None or buckets.due_second(request.due_ms) > watermark:
            self._queue.send([request], self._clock(), self._deadline)
            return Outcome.REDRIVEN
        # A pointer that is not the message's own was not written by us: delete nothing.
        if self._payloads.owns(request):
            self._payloads.delete(request, self._deadline)
        return Outcome.CLEANED

    def _current_watermark(self) -> int | None:
        if not self._watermark_read:
            self._watermark = self._store.get_watermark(self._deadline)
            self._watermark_read = True
        return self._watermark
