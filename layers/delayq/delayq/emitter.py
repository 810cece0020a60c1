"""Emitter: the delay queue -> the target topics, never early.

SQS releases a message at or before due (whole seconds, minus the lead). A message is a single
envelope or a bundle of many (``docs/internals.md``); every message of a bundle is handled on
its own: screened (bodies that are not ours and targets off the allow-list go to the reject
queue), cancel-checked, held to its own due time (at most ``max_hold_ms``), produced, and its
delivery report checked. An SQS message whose messages are all too early to hold is hidden
again (``ChangeMessageVisibility``) and reported as a batch item failure, so SQS brings it back
later.

Only failed items are reported back. A bundle of which some messages were settled (delivered,
cancelled, rejected) and others not (a Kafka delivery failed, a payload could not be read, the
deadline came first) is not reported failed, which would deliver the settled ones again: the
others are sent back to the delay queue as a new bundle, and the original counts as done. Only
when that send fails is the original reported failed (its delivered messages may then be
delivered twice, with the same ``delay-id``). An SQS message of which nothing was settled and
something failed is reported failed as a whole, so that SQS's receive count (and the dead-letter
queue after ``maxReceiveCount``) still applies to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from delayq import buckets
from delayq import constants as c
from delayq.clock import Clock, Sleep
from delayq.contract import (
    BodyEntry,
    DelayRequest,
    Reason,
    Rejection,
    decode_body,
    delivery_headers,
)
from delayq.exceptions import DelayQueueError, EnvelopeError, MalformedEventError
from delayq.kafka import NO_REPORT, KafkaDelivery, OutRecord
from delayq.payloads import PayloadStore
from delayq.queues import DelayQueue, RejectQueue, SqsQueue
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
    """What one batch did. ``failed`` are the SQS message ids to report back; the counts are
    of delay messages (a bundle counts each of its messages)."""

    failed: list[str] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    cancelled: int = 0
    redelayed: int = 0  # in SQS messages hidden again until closer to due
    requeued: int = 0  # sent back to the delay queue in a new bundle (the rest was settled)
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
    ready = run.hold_back_early(run.decode_and_screen(messages))
    run.send_rejects()
    if ready:
        cancelled = services.store.cancelled([i.request.delay_id for i in ready], deadline)
        run.result.cancelled = sum(1 for i in ready if i.request.delay_id in cancelled)
        ready = [i for i in ready if i.request.delay_id not in cancelled]
        run.produce_at_due(run.load_payloads(ready))
    run.settle()
    run.record_stats()
    return run.result


@dataclass
class _Item:
    """One delay message of an SQS message (the only one of a single envelope)."""

    message: QueuedMessage
    entry: BodyEntry
    request: DelayRequest


@dataclass
class _Unit:
    """One SQS message of the batch and what became of its delay messages."""

    message: QueuedMessage
    size: int = 0  # delay messages in it (entries of a bundle)
    settled: int = 0  # delivered, cancelled, rejected: done for good
    retry: list[tuple[int, str]] = field(default_factory=list)  # (DelaySeconds, entry text)
    failures: int = 0  # entries in ``retry`` because something failed (not only deferred)
    failed: bool = False  # reported back as a whole (body not ours, re-delayed, ...)


@dataclass
class _EmitRun:
    """The state of one batch: its clients, clock, deadline and result."""

    settings: Settings
    services: EmitterServices
    clock: Clock
    sleep: Sleep
    deadline: Deadline
    result: EmitResult = field(default_factory=EmitResult)
    units: dict[str, _Unit] = field(default_factory=dict)
    rejections: list[tuple[_Unit, BodyEntry | None, Rejection]] = field(default_factory=list)

    def decode_and_screen(self, messages: Sequence[QueuedMessage]) -> list[list[_Item]]:
        """Decode bodies; per SQS message, the delay messages that may be delivered. What is
        not ours, or not allowed, is set aside for the reject queue, entry by entry."""
        out: list[list[_Item]] = []
        for message in messages:
            unit = self.units.setdefault(message.message_id, _Unit(message))
            try:
                entries = decode_body(message.body)
            except EnvelopeError as e:
                unit.size = 1
                self.reject(unit, None, Reason.BAD_ENVELOPE, str(e))
                continue
            unit.size = len(entries)
            good: list[_Item] = []
            for entry in entries:
                request = entry.request
                if request is None:
                    self.reject(unit, entry, Reason.BAD_ENVELOPE, entry.error)
                elif not self.settings.target_allowed(request.target):
                    detail = f"target {request.target!r} is not on the emitter's allow-list"
                    self.reject(unit, entry, Reason.TARGET_NOT_ALLOWED, detail)
                elif request.payload_ref and not self.services.payloads.owns(request):
                    detail = f"payload_ref {request.payload_ref!r} is not this message's payload"
                    self.reject(unit, entry, Reason.BAD_ENVELOPE, detail)
                else:
                    good.append(_Item(message, entry, request))
            if good:
                out.append(good)
        return out

    def reject(self, unit: _Unit, entry: BodyEntry | None, reason: Reason, detail: str) -> None:
        """Set one entry (``None``: the whole body) aside for the reject queue, with the
        bytes it came in: the body, or the entry as a single envelope of its own."""
        record = {
            "sqs_message_id": unit.message.message_id,
            "body": unit.message.body if entry is None else entry.text,
        }
        self.rejections.append((unit, entry, Rejection(reason, detail, record, None, None, None)))

    def hold_back_early(self, per_message: list[list[_Item]]) -> list[_Item]:
        """Hide again each SQS message whose messages are all too early to hold (its rejects
        wait with it: they are sent when it comes back). A message too early inside an SQS
        message that is otherwise due goes back to the delay queue on its own."""
        now_ms = self.clock()
        keep: list[_Item] = []
        for items in per_message:
            unit = self.units[items[0].message.message_id]
            earliest = min(i.request.due_ms for i in items)
            if earliest - now_ms > self.settings.max_hold_ms:
                self.redelay(unit, earliest, now_ms)
                continue
            for item in items:
                if item.request.due_ms - now_ms <= self.settings.max_hold_ms:
                    keep.append(item)
                else:
                    self.again(item, now_ms, failure=False)
        return keep

    def redelay(self, unit: _Unit, earliest_ms: int, now_ms: int) -> None:
        seconds = buckets.visibility_delay_seconds(earliest_ms, now_ms, self.settings.emit_lead_ms)
        message = unit.message
        try:
            self.services.delay_queue.change_visibility(
                message.receipt_handle, max(1, seconds), self.deadline
            )
            self.result.redelayed += unit.size
        except DelayQueueError as e:
            self.result.errors.append(f"{message.message_id}: re-delay failed: {e}")
        # Failed either way: SQS keeps the message and brings it back, never early.
        unit.failed = True
        self.rejections = [r for r in self.rejections if r[0] is not unit]

    def send_rejects(self) -> None:
        """Send every reject. If that fails, an entry goes back to the delay queue like any
        other failure (to be rejected again), a whole body that is not ours fails its SQS
        message."""
        if not self.rejections:
            return
        try:
            self.services.rejects.send(
                [r for _, _, r in self.rejections], self.clock(), self.deadline
            )
        except DelayQueueError as e:
            for unit, entry, _ in self.rejections:
                self.result.errors.append(f"{unit.message.message_id}: reject queue: {e}")
                if entry is None:
                    unit.failed = True
                else:
                    unit.retry.append((0, entry.text))
                    unit.failures += 1
            return
        self.result.rejected = len(self.rejections)
        for unit, _, _ in self.rejections:
            unit.settled += 1

    def load_payloads(self, ready: list[_Item]) -> list[_Item]:
        """Fetch offloaded values; a message whose value cannot be read fails alone."""
        loaded: list[_Item] = []
        for item in ready:
            try:
                restored = self.services.payloads.restore(item.request, self.deadline)
            except DelayQueueError as e:
                self.fail(item, f"{item.request.delay_id}: {e}")
                continue
            loaded.append(_Item(item.message, item.entry, restored))
        return loaded

    def produce_at_due(self, loaded: list[_Item]) -> None:
        """Produce each message at its due time (earliest first), then check every report.
        Production stops while there is still time to flush and to send back what was not
        produced: a batch of large bundles never runs into the function's timeout."""
        loaded.sort(key=lambda item: item.request.due_ms)
        reserve = self.settings.kafka_timeout_seconds + c.EMIT_RESERVE_SECONDS
        outcomes: list[str | None] = []
        emitted: list[int] = []
        for index, item in enumerate(loaded):
            wait_seconds = max(0, item.request.due_ms - self.clock()) / 1000
            if self.deadline.remaining_seconds() - wait_seconds < reserve:
                for late in loaded[index:]:
                    self.again(late, self.clock(), failure=False)
                self.result.errors.append(
                    f"{len(loaded) - index} message(s) not produced before the deadline: "
                    "sent back to the delay queue"
                )
                del loaded[index:]
                break
            now = self.wait_until(item.request.due_ms)
            emitted.append(now)
            outcomes.append(NO_REPORT)
            record = OutRecord(
                item.request.target,
                item.request.key,
                item.request.value,
                delivery_headers(item.request, now, item.message.receive_count),
            )
            self.services.delivery.produce(record, partial(outcomes.__setitem__, index))
        if loaded:
            self.services.delivery.flush()
        for index, item in enumerate(loaded):
            request = item.request
            error = outcomes[index]
            if error:
                self.fail(item, f"{request.delay_id}: kafka: {error}")
                continue
            self.units[item.message.message_id].settled += 1
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

    def fail(self, item: _Item, error: str) -> None:
        """One delay message was not delivered: it is to be delivered again."""
        self.result.errors.append(error)
        self.again(item, self.clock(), failure=True)

    def again(self, item: _Item, now_ms: int, *, failure: bool) -> None:
        """Mark one delay message for the delay queue again, released at or before its due
        (at once when it is due). Its entry text keeps a claim-check pointer a pointer."""
        unit = self.units[item.message.message_id]
        delay = buckets.queue_delay_seconds(item.request.due_ms, now_ms, self.settings.emit_lead_ms)
        unit.retry.append((delay, item.entry.text))
        unit.failures += int(failure)

    def settle(self) -> None:
        """Decide each SQS message's fate: done, failed as a whole, or done once what is left
        of it is back on the delay queue (one send for the batch)."""
        resend: list[_Unit] = []
        for unit in self.units.values():
            if unit.failed:
                self.result.failed.append(unit.message.message_id)
            elif unit.retry and unit.settled == 0 and unit.failures:
                # Nothing delivered: let SQS count the attempt (dead-letter queue after
                # maxReceiveCount) rather than sending it as a new message.
                self.fail_back_off(unit)
            elif unit.retry:
                resend.append(unit)
        if not resend:
            return
        queue = DelayQueue(
            self.services.delay_queue,
            self.settings.emit_lead_ms,
            bundle_max_bytes=self.settings.bundle_max_bytes,
            bundle_max_messages=self.settings.bundle_max_messages,
        )
        try:
            queue.send_encoded([e for u in resend for e in u.retry], self.deadline)
        except DelayQueueError as e:
            self.result.errors.append(f"sending undelivered messages back failed: {e}")
            for unit in resend:
                self.fail_back_off(unit)
            return
        self.result.requeued += sum(len(u.retry) for u in resend)

    def fail_back_off(self, unit: _Unit) -> None:
        """Report an SQS message failed, visible again after a short back-off (2, 4, 8 ...
        seconds by receive count) rather than the queue's visibility timeout (minutes): a
        transient Kafka failure costs seconds of lateness. SQS still counts the receive
        towards the dead-letter queue."""
        message = unit.message
        seconds = min(2**message.receive_count, c.EMIT_RETRY_MAX_SECONDS)
        try:
            self.services.delay_queue.change_visibility(
                message.receipt_handle, seconds, self.deadline
            )
        except DelayQueueError as e:
            self.result.errors.append(f"{message.message_id}: back-off not set: {e}")
        self.result.failed.append(message.message_id)

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
