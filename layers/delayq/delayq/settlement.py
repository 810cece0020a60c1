"""What becomes of a delay message the emitter did not deliver: pure decisions, no I/O.

A message is retried (put back on the delay queue with a DelaySeconds) or dead-lettered (sent
to the delay queue's dead-letter queue with its reason). The rule depends on why it failed
(:class:`delayq.kafka.Failure`):

``target-unavailable``
    The target cluster could not be reached, or a service the delivery needs (S3 for the
    payload, DynamoDB for the cancel check) could not be read. Nothing is wrong with the
    message, so its attempts are not used up: it is retried with a back-off that grows with
    its lateness (2 s, then about an eighth of how late it is, at most 60 s) until
    ``target_outage_max_seconds`` after its first failed delivery (``fs`` in its envelope) or
    its last release slot, whichever is later, then dead-lettered. An outage of an hour ends
    with everything delivered; so does one met by a message that comes late (after a
    scheduler outage, a redrive).
``target-refused``
    The cluster refused this record (too large, unknown topic, not authorised). It is retried
    after 2, 4, 8 ... s and dead-lettered at its ``delivery_max_attempts``-th refusal.
``payload-missing``
    The claim-check object is not there: no retry can bring it back; dead-lettered at once.
``release-cap-full``
    The target is up, but the tenant's release cap had no room for a late message within
    ``CATCH_UP_SPREAD_SECONDS`` (``strict_caps``). Retried like an outage; dead-lettered with
    this reason ``target_outage_max_seconds`` after its last placement (the release slot
    ingest or a catch-up gave it), never as ``target-unavailable``.

A message that is only early (too early to hold in this invocation) is retried at its due
time, like any delay message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from delayq import buckets
from delayq import constants as c
from delayq.envelope import Envelope
from delayq.kafka import Failure, Undelivered
from delayq.queues import QueueEntry
from delayq.records import DelayRequest
from delayq.settings import Settings

__all__ = [
    "DeadLetter",
    "Retry",
    "after_failure",
    "outage_backoff_seconds",
    "refusal_backoff_seconds",
    "when_due",
]


@dataclass(frozen=True)
class Retry:
    """Put the message back on the delay queue."""

    entry: QueueEntry


@dataclass(frozen=True)
class DeadLetter:
    """Send the message to the dead-letter queue, with why."""

    reason: str
    detail: str


def outage_backoff_seconds(request: DelayRequest, now_ms: int) -> int:
    """The wait before delivering again while the target is unreachable: short at first,
    about an eighth of the lateness later on, at most a minute."""
    late_seconds = max(0, now_ms - request.release_at_ms) // 1000
    return int(min(c.EMIT_RETRY_MAX_SECONDS, max(2, late_seconds // 8)))


def refusal_backoff_seconds(attempts: int) -> int:
    """The wait before the ``attempts + 1``-th try of a refused record: 2, 4, 8 ... s."""
    return int(min(c.EMIT_RETRY_MAX_SECONDS, 2**attempts))


def after_failure(
    request: DelayRequest,
    entry_text: str,
    failure: Undelivered,
    *,
    now_ms: int,
    settings: Settings,
) -> Retry | DeadLetter:
    """What to do with a message (``request`` as queued: a pointer stays a pointer; its
    envelope ``entry_text``) whose delivery failed."""
    if failure.failure is Failure.REFUSED:
        attempts = request.attempts + 1
        if attempts >= settings.delivery_max_attempts:
            detail = f"refused {attempts} time(s); last: {failure.detail}"
            return DeadLetter(str(Failure.REFUSED), detail)
        retried = dataclasses.replace(request, attempts=attempts)
        text = Envelope(retried).encode()
        delay = refusal_backoff_seconds(attempts)
        return Retry(QueueEntry(delay, text, request.offloaded_bytes, request.priority))
    if failure.failure is Failure.PAYLOAD_MISSING:
        return DeadLetter(str(Failure.PAYLOAD_MISSING), failure.detail)
    if failure.failure is Failure.CAP_FULL:
        since_ms, since = request.release_at_ms, "its last release slot"
    else:
        # A catch-up slot after the first failure starts the count again, as for a full cap.
        failing_since_ms = request.failing_since_ms or now_ms
        since_ms = max(failing_since_ms, request.release_at_ms)
        since = "its first failed delivery or its last release slot"
        if not request.failing_since_ms:
            entry_text = Envelope(dataclasses.replace(request, failing_since_ms=now_ms)).encode()
    if now_ms - since_ms > settings.target_outage_max_seconds * 1000:
        detail = (
            f"not delivered {settings.target_outage_max_seconds} s after {since}; "
            f"last: {failure.detail}"
        )
        return DeadLetter(str(failure.failure), detail)
    delay = outage_backoff_seconds(request, now_ms)
    return Retry(QueueEntry(delay, entry_text, request.offloaded_bytes, request.priority))


def when_due(request: DelayRequest, entry_text: str, *, now_ms: int, lead_ms: int) -> Retry:
    """Put back a message that is not due yet: released at or before its due time."""
    delay = buckets.queue_delay_seconds(request.release_at_ms, now_ms, lead_ms)
    return Retry(QueueEntry(delay, entry_text, request.offloaded_bytes, request.priority))
