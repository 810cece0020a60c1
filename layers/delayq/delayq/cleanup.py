"""Cleanup: the safety net behind TTL.

TTL removes a stored message at due + grace (or later: AWS deletes within days of expiry).
If the scheduler had not sent it by then, it is re-driven to the delay queue now (late, but
not lost) and counted:

- its due-second is beyond the watermark (the scheduler was stopped longer than the grace);
- or it lies in a late range: the scheduler passed that second when TTL may already have
  deleted some of its messages, so this one may never have been read;
- or the watermark cannot be read: in doubt, re-drive (at worst a duplicate with the same
  ``delay-id``).

Otherwise it was sent long ago and nothing is done. Offloaded payloads are not deleted here,
nor anywhere: the bucket's lifecycle rule expires them after a retention that outlives every
copy of their message (duplicates, retries, dead-letter queues). Only TTL removals count; a
user's own delete is not a reason to deliver.

If the re-drive fails after its retries, the record fails and the stream event source
retries it; after its last retry the on-failure destination (an S3 bucket) keeps the whole
invocation record, old images included, for ``delayq redrive cleanup-failures``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayq import buckets
from delayq import constants as c
from delayq.clock import Clock
from delayq.exceptions import DelayQueueError
from delayq.queues import DelayQueue
from delayq.retry import Deadline
from delayq.store import MessageStore, Watermark, request_from_item

__all__ = [
    "CleanupServices",
    "Outcome",
    "TtlCleanup",
    "is_ttl_removal",
]


class Outcome(enum.Enum):
    """What happened to one stream record."""

    IGNORED = "ignored"  # not a TTL removal of a message
    REDRIVEN = "redriven"  # maybe never scheduled: sent to the delay queue now
    CLEANED = "cleaned"  # scheduled before: nothing to do


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


class TtlCleanup:
    """Handles one stream batch; reads the watermark once, on first need (it only moves
    forward, so an older reading only re-drives more)."""

    def __init__(self, services: CleanupServices, *, clock: Clock, deadline: Deadline) -> None:
        self._store = services.store
        self._queue = services.delay_queue
        self._clock = clock
        self._deadline = deadline
        self._watermark: Watermark | None = None
        self._watermark_read = False

    def handle(self, record: Mapping[str, Any]) -> Outcome:
        """Process one stream record (raises on AWS failure, so the batch item is retried)."""
        image = (record.get("dynamodb") or {}).get("OldImage") or {}
        if not is_ttl_removal(record) or image.get("kind", {}).get("S") != c.KIND_MESSAGE:
            return Outcome.IGNORED
        request = request_from_item(image)
        watermark = self._current_watermark()
        second = buckets.due_second(request.release_at_ms)  # the bucket it waited in
        if watermark is None or not watermark.scheduled(second):
            self._queue.send([request], self._clock(), self._deadline)
            return Outcome.REDRIVEN
        return Outcome.CLEANED

    def _current_watermark(self) -> Watermark | None:
        """The watermark, or None when there is none or it cannot be read (then every
        removal is re-driven: in doubt, deliver)."""
        if not self._watermark_read:
            try:
                self._watermark = self._store.read_watermark(self._deadline)
            except DelayQueueError:
                self._watermark = None
            self._watermark_read = True
        return self._watermark
