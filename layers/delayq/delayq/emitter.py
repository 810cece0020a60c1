"""Emitter: the delay queue -> the target topics, never early.

SQS releases a message at or before due (whole seconds, minus the lead). The emitter holds a
message that is early by at most ``max_hold_ms`` and emits it at due; one that is earlier
than that is hidden again (``ChangeMessageVisibility``) and reported as a batch item failure,
so SQS brings it back later. Cancelled ids are dropped; targets off the allow-list and bodies
that are not ours go to the reject queue. Only failed items are reported back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from delayq import buckets
from delayq.clock import Clock, Sleep
from delayq.contract import DelayRequest, Envelope, Reason, Rejection, delivery_headers
from delayq.exceptions import DelayQueueError, EnvelopeError, MalformedEventError
from delayq.kafka import NO_REPORT, KafkaDelivery, OutRecord
from delayq.payloads import PayloadStore
from delayq.queues import RejectQueue, SqsQueue
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.stats import DeliveryStats
from delayq.store import MessageStore


@dataclass(frozen=True)
class QueuedMessage:
    """The parts of an SQS event record the emitter uses."""

    message_id: str
    receipt_handle: str
    body: str
    receive_count: int


def messages_from_event(event: Any) -> list[QueuedMessage]:
    """The records of an SQS event; a whole event of another shape fails loudly."""
    if not isinstance(event, Mapping) or not isinstance(event.get("Records"), list):
        raise MalformedEventError("not an SQS event: expected a 'Records' list")
    try:
        return [
            QueuedMessage(
                message_id=r["messageId"],
                receipt_handle=r["receiptHandle"],
                body=r["body"],
                receive_count=int(r.get("attributes", {}).get("ApproximateReceiveCount", 1)),
            )
            for r in event["Records"]
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedEventError(f"not an SQS event record: {e}") from e


@dataclass(frozen=True)
class Delivery:
    """One acknowledged emission (for lateness statistics)."""

    target: str
    due_ms: int
    emitted_ms: int

    @property
    def lateness_ms(self) -> int:
        """Emit time minus due time (never negative unless something is broken)."""
        return self.emitted_ms - self.due_ms


@dataclass
class EmitResult:
    """What one batch did; ``failed`` are the message ids to report back to SQS."""

    failed: list[str] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    cancelled: int = 0
    redelayed: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EmitterServices:
    """The adapters the emitter uses."""

    delivery: KafkaDelivery
    store: MessageStore
    delay_queue: SqsQueue
    rejects: RejectQueue
    payloads: PayloadStore
    stats: DeliveryStats = field(default_factory=DeliveryStats)


def emit_batch(
    messages: Sequence[QueuedMessage],
    *,
    settings: Settings,
    services: EmitterServices,
    clock: Clock,
    sleep: Sleep,
    deadline: Deadline,
) -> EmitResult:
    """Deliver one SQS batch; per-item failures are returned, never raised."""
    run = _EmitRun(settings, services, clock, sleep, deadline)
    ready = run.decode_and_screen(messages)
    if ready:
        cancelled = services.store.cancelled([r.delay_id for _, r in ready], deadline)
        run.result.cancelled = sum(1 for _, r in ready if r.delay_id in cancelled)
        ready = [(m, r) for m, r in ready if r.delay_id not in cancelled]
        run.produce_at_due(run.load_payloads(run.hold_back_early(ready)))
    run.record_stats()
    return run.result


Pair = tuple[QueuedMessage, DelayRequest]


@dataclass
class _EmitRun:
    """The state of one batch: its clients, clock, deadline and result."""

    settings: Settings
    services: EmitterServices
    clock: Clock
    sleep: Sleep
    deadline: Deadline
    result: EmitResult = field(default_factory=EmitResult)

    def decode_and_screen(self, messages: Sequence[QueuedMessage]) -> list[Pair]:
        """Decode bodies; what is not ours, or not allowed, goes to the reject queue."""
        ready: list[Pair] = []
        rejected: list[tuple[QueuedMessage, Rejection]] = []
        for message in messages:
            try:
                request = Envelope.decode(message.body).request
            except EnvelopeError as e:
                rejected.append((message, _rejection(Reason.BAD_ENVELOPE, str(e), message)))
                continue
            if not self.settings.target_allowed(request.target):
                detail = f"target {request.target!r} is not on the emitter's allow-list"
                rejected.append((message, _rejection(Reason.TARGET_NOT_ALLOWED, detail, message)))
                continue
            if request.payload_ref and not self.services.payloads.owns(request):
                detail = f"payload_ref {request.payload_ref!r} is not this message's payload"
                rejected.append((message, _rejection(Reason.BAD_ENVELOPE, detail, message)))
                continue
            ready.append((message, request))
        if rejected:
            try:
                self.services.rejects.send([r for _, r in rejected], self.clock(), self.deadline)
                self.result.rejected = len(rejected)
            except DelayQueueError as e:
                for message, _ in rejected:
                    self.fail(message, f"reject queue: {e}")
        return ready

    def hold_back_early(self, ready: list[Pair]) -> list[Pair]:
        """Re-delay messages too early to hold; keep the rest."""
        now_ms = self.clock()
        keep = []
        for message, request in ready:
            if request.due_ms - now_ms <= self.settings.max_hold_ms:
                keep.append((message, request))
                continue
            seconds = buckets.visibility_delay_seconds(
                request.due_ms, now_ms, self.settings.emit_lead_ms
            )
            try:
                self.services.delay_queue.change_visibility(
                    message.receipt_handle, max(1, seconds), self.deadline
                )
                self.result.redelayed += 1
            except DelayQueueError as e:
                self.result.errors.append(f"{request.delay_id}: re-delay failed: {e}")
            # Failed either way: SQS keeps the message and brings it back, never early.
            self.result.failed.append(message.message_id)
        return keep

    def load_payloads(self, ready: list[Pair]) -> list[Pair]:
        """Fetch offloaded values; a message whose value cannot be read fails alone."""
        loaded: list[Pair] = []
        for message, request in ready:
            try:
                loaded.append((message, self.services.payloads.restore(request, self.deadline)))
            except DelayQueueError as e:
                self.fail(message, f"{request.delay_id}: {e}")
        return loaded

    def produce_at_due(self, loaded: list[Pair]) -> None:
        """Produce each message at its due time (earliest first), then check every report."""
        loaded.sort(key=lambda pair: pair[1].due_ms)
        outcomes: list[str | None] = [NO_REPORT] * len(loaded)
        emitted: list[int] = [0] * len(loaded)
        for index, (message, request) in enumerate(loaded):
            emitted[index] = now = self.wait_until(request.due_ms)
            record = OutRecord(
                request.target,
                request.key,
                request.value,
                delivery_headers(request, now, message.receive_count),
            )
            self.services.delivery.produce(record, partial(outcomes.__setitem__, index))
        self.services.delivery.flush()
        for index, (message, request) in enumerate(loaded):
            error = outcomes[index]
            if error:
                self.fail(message, f"{request.delay_id}: kafka: {error}")
                continue
            self.result.deliveries.append(Delivery(request.target, request.due_ms, emitted[index]))
            if request.payload_ref:
                self.delete_payload(request)

    def wait_until(self, due_ms: int) -> int:
        """Sleep until ``due_ms`` on this function's clock; returns the time reached."""
        while (now := self.clock()) < due_ms:
            self.sleep(max(due_ms - now, 1) / 1000)
        return now

    def delete_payload(self, request: DelayRequest) -> None:
        """Delivered: failing the message now would emit it twice, so a failed delete is
        reported (the bucket's lifecycle rule removes the object later), not retried."""
        try:
            self.services.payloads.delete(request, self.deadline)
        except DelayQueueError as e:
            self.result.errors.append(f"{request.delay_id}: payload not deleted: {e}")

    def record_stats(self) -> None:
        """Count deliveries into the container's statistics; write what the flush policy says
        is due (about one item per container-minute). A failed write loses statistics, never
        messages, and is reported."""
        stats = self.services.stats
        for d in self.result.deliveries:
            stats.add(d.target, d.due_ms, d.emitted_ms)
        for item in stats.flush(self.clock()):
            try:
                self.services.store.put_item(item, self.deadline)
            except DelayQueueError as e:
                self.result.errors.append(f"statistics not written: {e}")

    def fail(self, message: QueuedMessage, error: str) -> None:
        """Report one message back to SQS as failed."""
        self.result.failed.append(message.message_id)
        self.result.errors.append(error)


def _rejection(reason: Reason, detail: str, message: QueuedMessage) -> Rejection:
    return Rejection(
        reason,
        detail,
        {"sqs_message_id": message.message_id, "body": message.body},
        None,
        None,
        None,
    )
