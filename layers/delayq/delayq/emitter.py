"""Emitter: the delay queue -> the target topics, never early.

SQS releases a message at or before due (whole seconds, minus the lead). A message is a single
envelope or a bundle of many (``docs/internals.md``); every message of a bundle is handled on
its own: screened (bodies that are not ours and targets off the allow-list go to the reject
queue), cancel-checked, held to its own due time (at most ``max_hold_ms``), its offloaded
value fetched, produced, and its delivery report checked. An SQS message whose messages are
all too early to hold is hidden again (``ChangeMessageVisibility``) and reported as a batch
item failure, so SQS brings it back later.

A capped tenant's message whose release second has passed (the pipeline catching up after
an outage or a backlog) takes a new slot from its cap's counters first (``delayq.shaping``):
it goes now, is held, or goes back to the delay queue until its slot, so a catch-up never
sends more than the cap in a second. Messages on time make no call for it.

What was not delivered is settled message by message (``delayq.settlement``): put back on the
delay queue (not due yet, the target unreachable, a refusal below the attempt limit) or
dead-lettered with its reason (refused too often, unreachable for too long, its payload gone).
Both are sends; once they succeed the SQS message counts as done, so the messages of it that
were delivered are not delivered again. A message the delay queue refuses to take back is
settled alone: dead-lettered with its own reason and its envelope (with its attempts). Only
when a send keeps failing (out of retries or time, or the dead-letter queue refusing) is the
SQS message reported failed (visible again after a short back-off: 2, 4, 8 ... s by receive
count); its delivered messages may then be delivered twice, with the same ``delay-id``.

Nothing after a delivery can fail the batch: the statistics write, the re-queue and the
visibility change report their errors and go on. Offloaded values are fetched as they are
produced, a few ahead within a byte budget, so a batch of large values never holds more than
that budget (plus the producer's own bounded buffer) in memory, and production stops, leaving
the rest for the delay queue, while there is still time to flush before the deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from delayq import buckets
from delayq import constants as c
from delayq.clock import Clock, Sleep
from delayq.envelope import BodyEntry, Envelope, dead_letter_text, decode_body
from delayq.exceptions import (
    DelayQueueError,
    EnvelopeError,
    MalformedEventError,
    PayloadMissingError,
    PayloadStoreError,
    RetriesExhaustedError,
)
from delayq.kafka import Failure, KafkaDelivery, Undelivered
from delayq.payloads import PayloadStore
from delayq.producing import Delivery, produce_at_due, record_deliveries
from delayq.queues import DelayQueue, QueueEntry, RejectQueue
from delayq.records import DelayRequest, Reason, RejectedRecord, Rejection
from delayq.retry import Deadline
from delayq.settings import Settings
from delayq.settlement import Retry, after_failure, when_due
from delayq.shaping import Shaper, missed_slot_cap
from delayq.stats import DeliveryStats
from delayq.store import MessageStore

__all__ = [
    "DELAY_QUEUE_RECORD_KEYS",
    "EmitResult",
    "EmitterServices",
    "QueuedMessage",
    "delay_queue_rejection",
    "emit_batch",
    "messages_from_event",
    "screen",
]


@dataclass(frozen=True)
class QueuedMessage:
    """The parts of an SQS event record the emitter uses."""

    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    # The queue it came from (``eventSourceARN``): one of the delay queues, by priority.
    source_arn: str = ""


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
                source_arn=str(r.get("eventSourceARN", "")),
            )
            for r in event["Records"]
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedEventError(f"not an SQS event record: {e}") from e


#: The keys of the record of a reject the emitter writes: the delay-queue message it screened
#: out, not a Kafka record (``delay_queue_rejection``).
DELAY_QUEUE_RECORD_KEYS = frozenset({"sqs_message_id", "body"})


def screen(entry: BodyEntry, settings: Settings) -> DelayRequest | RejectedRecord:
    """The request of a decoded delay-queue entry the emitter may deliver, or why it will
    not: not ours (``bad-envelope``), or its target off the allow-list. A redrive of an
    emitter reject screens its entries the same way."""
    request = entry.request
    if request is None:
        return RejectedRecord(Reason.BAD_ENVELOPE, entry.error)
    if not settings.target_allowed(request.target):
        detail = f"target {request.target!r} is not on the emitter's allow-list"
        return RejectedRecord(Reason.TARGET_NOT_ALLOWED, detail)
    return request


def delay_queue_rejection(reason: Reason, detail: str, sqs_message_id: str, body: str) -> Rejection:
    """A reject of a delay-queue body (or of one entry of it, as a single envelope of its
    own), with the bytes it came in; it has no Kafka coordinates."""
    record = {"sqs_message_id": sqs_message_id, "body": body}
    return Rejection(reason, detail, record, None, None, None)


@dataclass
class EmitResult:
    """What one batch did. ``failed`` are the SQS message ids to report back; the counts are
    of delay messages (a bundle counts each of its messages)."""

    failed: list[str] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    cancelled: int = 0
    redelayed: int = 0  # in SQS messages hidden again until closer to due
    requeued: int = 0  # put back on the delay queue (not due yet, or to be tried again)
    dead_lettered: int = 0  # sent to the dead-letter queue with their reason
    rejected: int = 0
    # Late messages of capped tenants that their cap moved to a later second (catch-up).
    cap_held: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EmitterServices:
    """The adapters the emitter uses. ``dead_letters`` bundles onto the delay queue's
    dead-letter queue, like ``delay_queue`` onto the delay queue. ``shaper`` holds the
    release caps while the pipeline catches up (None: no tenant is capped, or
    ``strict_caps`` is off: nothing to check)."""

    delivery: KafkaDelivery
    store: MessageStore
    delay_queue: DelayQueue
    dead_letters: DelayQueue
    rejects: RejectQueue
    payloads: PayloadStore
    stats: DeliveryStats = field(default_factory=DeliveryStats)
    shaper: Shaper | None = None


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
    run.produce_at_due(run.catch_up(run.drop_cancelled(ready)))
    run.settle()
    run.record_stats()
    return run.result


@dataclass
class _DelayMessage:
    """One delay message of an SQS message (the only one of a single envelope), as queued:
    an offloaded value is still a pointer."""

    message: QueuedMessage
    entry: BodyEntry
    request: DelayRequest

    def pace(self, slot_ms: int) -> None:
        """Move it to a later slot of its tenant's cap (counted with the late ones there, not
        ranked: nothing displaces it); a re-send carries the slot."""
        self.request = dataclasses.replace(self.request, paced_ms=slot_ms, release_rank=-1)
        self.entry = BodyEntry(Envelope(self.request).encode(), self.request)


def _entry(delay_seconds: int, text: str, request: DelayRequest | None) -> QueueEntry:
    """An envelope to send again, placed as its message was: its priority's delay queue and
    the bytes of its offloaded value (a body that is not a request: the normal queue)."""
    if request is None:
        return QueueEntry(delay_seconds, text)
    return QueueEntry(delay_seconds, text, request.offloaded_bytes, request.priority)


#: The dead-letter reason of a message the delay queue refused to take back that had no
#: failure of its own (not due yet, its reject not sent).
REQUEUE_REFUSED = "requeue-refused"


@dataclass(frozen=True)
class _Retry:
    """A delay message to put back, with the reason it is dead-lettered under if the delay
    queue refuses it (its own failure, or ``REQUEUE_REFUSED``) and why it was going back."""

    entry: QueueEntry
    reason: str = REQUEUE_REFUSED
    why: str = "not due yet"


@dataclass
class _SqsMessageState:
    """One SQS message of the batch and what became of its delay messages."""

    message: QueuedMessage
    size: int = 0  # delay messages in it (entries of a bundle)
    settled: int = 0  # delivered, cancelled, rejected: done for good
    retries: list[_Retry] = field(default_factory=list)
    # Dead-letter envelopes, each placed as its message was (its priority's delay queue if
    # the dead-letter send fails and it goes back).
    dead: list[QueueEntry] = field(default_factory=list)
    failed: bool = False  # reported back as a whole (body not ours, re-delayed, ...)


class _Fetches:
    """Offloaded values fetched ahead of producing, in due order, at most ``budget`` bytes
    in flight (always at least the one needed next)."""

    def __init__(
        self,
        payloads: PayloadStore,
        items: Sequence[_DelayMessage],
        budget: int,
        unknown_size: int,
        deadline: Deadline,
    ) -> None:
        self._payloads = payloads
        self._items = items
        self._budget = budget
        self._unknown_size = unknown_size
        self._deadline = deadline
        self._futures: dict[int, Future[DelayRequest]] = {}
        self._next = 0
        self._in_flight = 0

    def _size(self, index: int) -> int:
        return self._items[index].request.offloaded_bytes or self._unknown_size

    def take(self, index: int) -> DelayRequest:
        """The request of item ``index`` with its value (raises what the fetch raised)."""
        self._fill(index)
        future = self._futures.pop(index, None)
        if future is None:
            return self._items[index].request
        try:
            return future.result(timeout=max(0.0, self._deadline.remaining_seconds()))
        except FutureTimeout as e:
            raise PayloadStoreError("payload not fetched before the deadline") from e
        finally:
            self._in_flight -= self._size(index)
            self._fill(index + 1)

    def load(self, index: int) -> DelayRequest | Undelivered:
        """:meth:`take`, with what went wrong as a failure class (for ``produce_at_due``)."""
        try:
            return self.take(index)
        except PayloadMissingError as e:
            return Undelivered(Failure.PAYLOAD_MISSING, str(e))
        except DelayQueueError as e:
            return Undelivered(Failure.UNAVAILABLE, f"payload not read: {e}")

    def _fill(self, needed: int) -> None:
        while self._next < len(self._items):
            index = self._next
            request = self._items[index].request
            if request.payload_ref:
                size = self._size(index)
                if self._in_flight and index > needed and self._in_flight + size > self._budget:
                    return
                self._futures[index] = self._payloads.submit_restore(request, self._deadline)
                self._in_flight += size
            self._next += 1

    def close(self) -> None:
        """Cancel the fetches nobody will take (a batch that stopped early)."""
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


@dataclass
class _EmitRun:
    """The state of one batch: its clients, clock, deadline and result."""

    settings: Settings
    services: EmitterServices
    clock: Clock
    sleep: Sleep
    deadline: Deadline
    result: EmitResult = field(default_factory=EmitResult)
    states: dict[str, _SqsMessageState] = field(default_factory=dict)
    rejections: list[tuple[_SqsMessageState, BodyEntry | None, Rejection]] = field(
        default_factory=list
    )

    def decode_and_screen(self, messages: Sequence[QueuedMessage]) -> list[list[_DelayMessage]]:
        """Decode bodies; per SQS message, the delay messages that may be delivered. What is
        not ours, or not allowed, is set aside for the reject queue, entry by entry."""
        out: list[list[_DelayMessage]] = []
        for message in messages:
            state = self.states.setdefault(message.message_id, _SqsMessageState(message))
            try:
                entries = decode_body(message.body)
            except EnvelopeError as e:
                state.size = 1
                self.reject(state, None, Reason.BAD_ENVELOPE, str(e))
                continue
            state.size = len(entries)
            good: list[_DelayMessage] = []
            for entry in entries:
                screened = screen(entry, self.settings)
                if isinstance(screened, RejectedRecord):
                    self.reject(state, entry, screened.reason, screened.detail)
                elif screened.payload_ref and not self.services.payloads.owns(screened):
                    detail = f"payload_ref {screened.payload_ref!r} is not this message's payload"
                    self.reject(state, entry, Reason.BAD_ENVELOPE, detail)
                else:
                    good.append(_DelayMessage(message, entry, screened))
            if good:
                out.append(good)
        return out

    def reject(
        self, state: _SqsMessageState, entry: BodyEntry | None, reason: Reason, detail: str
    ) -> None:
        """Set one entry (``None``: the whole body) aside for the reject queue, with the
        bytes it came in: the body, or the entry as a single envelope of its own."""
        body = state.message.body if entry is None else entry.text
        rejection = delay_queue_rejection(reason, detail, state.message.message_id, body)
        self.rejections.append((state, entry, rejection))

    def hold_back_early(self, per_message: list[list[_DelayMessage]]) -> list[_DelayMessage]:
        """Hide again each SQS message whose messages are all too early to hold (its rejects
        wait with it: they are sent when it comes back). A message too early inside an SQS
        message that is otherwise due goes back to the delay queue on its own."""
        now_ms = self.clock()
        keep: list[_DelayMessage] = []
        for items in per_message:
            state = self.states[items[0].message.message_id]
            earliest = min(i.request.release_at_ms for i in items)
            if earliest - now_ms > self.settings.max_hold_ms:
                self.redelay(state, earliest, now_ms)
                continue
            for item in items:
                if item.request.release_at_ms - now_ms <= self.settings.max_hold_ms:
                    keep.append(item)
                else:
                    self.again(item, now_ms)
        return keep

    def redelay(self, state: _SqsMessageState, earliest_ms: int, now_ms: int) -> None:
        seconds = buckets.visibility_delay_seconds(earliest_ms, now_ms, self.settings.emit_lead_ms)
        message = state.message
        try:
            self.services.delay_queue.source(message.source_arn).change_visibility(
                message.receipt_handle, max(1, seconds), self.deadline
            )
            self.result.redelayed += state.size
        except DelayQueueError as e:
            self.result.errors.append(f"{message.message_id}: re-delay failed: {e}")
        # Failed either way: SQS keeps the message and brings it back, never early.
        state.failed = True
        self.rejections = [r for r in self.rejections if r[0] is not state]

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
            for state, entry, _ in self.rejections:
                self.result.errors.append(f"{state.message.message_id}: reject queue: {e}")
                if entry is None:
                    state.failed = True
                else:
                    why = f"reject queue: {e}"
                    state.retries.append(_Retry(_entry(0, entry.text, entry.request), why=why))
            return
        self.result.rejected = len(self.rejections)
        for state, _, _ in self.rejections:
            state.settled += 1

    def drop_cancelled(self, ready: list[_DelayMessage]) -> list[_DelayMessage]:
        """The messages no cancel applies to. When the markers cannot be read, nothing is
        delivered: every message is tried again after the back-off (a cancel must win)."""
        if not ready:
            return ready
        try:
            flags = self.services.store.cancelled(
                [i.request for i in ready], self.clock(), self.deadline
            )
        except DelayQueueError as e:
            failure = Undelivered(Failure.UNAVAILABLE, f"cancel markers not read: {e}")
            for item in ready:
                self.fail(item, failure)
            return []
        keep = []
        for item, cancelled in zip(ready, flags, strict=True):
            if cancelled:
                self.states[item.message.message_id].settled += 1
                self.result.cancelled += 1
            else:
                keep.append(item)
        return keep

    def catch_up(self, ready: list[_DelayMessage]) -> list[_DelayMessage]:
        """Give the capped tenants' messages whose release second has passed a new slot
        (``Shaper.catch_up``). One in this second goes now, one within the hold is held, a
        later one goes back to the delay queue carrying its slot: a new SQS message, so a
        message waiting for its cap never uses up receives towards the dead-letter queue.
        Where no slot was taken (the counter unreachable), the messages are not produced:
        they are tried again like any delivery whose dependency is down (fail closed: the
        cap protects the tenant's consumers exactly while the pipeline catches up)."""
        shaper = self.services.shaper
        if shaper is None or not ready:
            return ready
        plan = shaper.catch_up(
            [i.request for i in ready], self.clock(), self.deadline, clock=self.clock
        )
        if not plan.slots and not plan.unplaced and not plan.again:
            return ready
        now_ms = self.clock()
        keep: list[_DelayMessage] = []
        for index, item in enumerate(ready):
            if index in plan.again:
                # Its claim came back too late to use: it comes back for another.
                self.again(item, now_ms)
                continue
            why = plan.unplaced.get(index)
            if why is not None:
                failure = Failure.CAP_FULL if index in plan.full else Failure.UNAVAILABLE
                self.fail(item, Undelivered(failure, f"release cap: {why}"))
                continue
            slot_ms = plan.slots.get(index)
            if slot_ms is not None:
                item.pace(slot_ms)
                if buckets.due_second(slot_ms) > buckets.due_second(now_ms):
                    self.result.cap_held += 1
                elif buckets.due_second(slot_ms) < buckets.due_second(now_ms):
                    # Its second ended while the slot was claimed: produced now, it would
                    # land in a second that did not count it. It comes back for another.
                    self.again(item, now_ms)
                    continue
            if item.request.release_at_ms - now_ms <= self.settings.max_hold_ms:
                keep.append(item)
            else:
                self.again(item, now_ms)
        return keep

    def produce_at_due(self, items: list[_DelayMessage]) -> None:
        """Produce each message at its due time (earliest first), its offloaded value fetched
        just ahead of it, then check every report (``delayq.producing``)."""
        if not items:
            return
        items.sort(key=lambda item: item.request.release_at_ms)
        fetches = _Fetches(
            self.services.payloads,
            items,
            c.EMIT_FETCH_BUDGET_BYTES,
            self.settings.max_payload_bytes,
            self.deadline,
        )
        shaper = self.services.shaper
        try:
            run = produce_at_due(
                items,
                due_of=lambda item: item.request.release_at_ms,
                load=fetches.load,
                attempt_of=lambda item, r: r.attempts + item.message.receive_count,
                delivery=self.services.delivery,
                clock=self.clock,
                sleep=self.sleep,
                deadline=self.deadline,
                reserve_seconds=self.settings.kafka_timeout_seconds + c.EMIT_RESERVE_SECONDS,
                missed=None
                if shaper is None
                else lambda r, now: missed_slot_cap(r, shaper.limits, now) is not None,
            )
        finally:
            fetches.close()
        for item, failure in run.unloaded:
            self.fail(item, failure)
        if run.left:
            self.put_back(run.left)
        # Its second ended before it went (a slow fetch, the batch before it): produced now, it
        # would land in a second that did not count it. It comes back for another.
        for item in run.missed:
            self.again(item, self.clock())
        for produced in run.produced:
            item = produced.item
            if produced.outcome is not None:
                self.fail(item, produced.outcome)
                continue
            request = item.request
            self.states[item.message.message_id].settled += 1
            self.result.deliveries.append(
                Delivery.of(request, produced.emitted_ms, produced.attempt)
            )

    def put_back(self, items: Sequence[_DelayMessage]) -> None:
        """Messages this invocation has no time left to produce: back to the delay queue."""
        now_ms = self.clock()
        for item in items:
            self.again(item, now_ms)
        self.result.errors.append(
            f"{len(items)} message(s) not produced before the deadline: "
            "sent back to the delay queue"
        )

    def fail(self, item: _DelayMessage, failure: Undelivered) -> None:
        """One delay message was not delivered: retried or dead-lettered (``settlement``)."""
        request = item.request
        self.result.errors.append(f"{request.delay_id}: {failure.failure}: {failure.detail}")
        now_ms = self.clock()
        state = self.states[item.message.message_id]
        step = after_failure(
            request, item.entry.text, failure, now_ms=now_ms, settings=self.settings
        )
        if isinstance(step, Retry):
            why = f"{failure.failure}: {failure.detail}"
            state.retries.append(_Retry(step.entry, str(failure.failure), why))
        else:
            text = dead_letter_text(item.entry.text, step.reason, step.detail, now_ms)
            state.dead.append(_entry(0, text, request))

    def again(self, item: _DelayMessage, now_ms: int) -> None:
        """Put one delay message back, released at or before its due (at once when due)."""
        step = when_due(
            item.request, item.entry.text, now_ms=now_ms, lead_ms=self.settings.emit_lead_ms
        )
        self.states[item.message.message_id].retries.append(_Retry(step.entry))

    def settle(self) -> None:
        """Decide each SQS message's fate: done, or failed as a whole. Dead letters are sent
        first (if that fails they are retried like the others, in a minute), then everything
        to retry in one send. A message the delay queue refuses is settled alone: dead-lettered
        with its own reason and its envelope (its attempts), so the SQS message is done and its
        delivered messages are not delivered again. Only an SQS message with a send still
        failing (out of retries or time, or the dead-letter queue refusing) is reported
        failed, to come back whole."""
        pending = [s for s in self.states.values() if not s.failed and (s.retries or s.dead)]
        self.result.failed.extend(s.message.message_id for s in self.states.values() if s.failed)
        dead = [(state, entry) for state in pending for entry in state.dead]
        if dead:
            try:
                self.services.dead_letters.send_entries([e for _, e in dead], self.deadline)
                self.result.dead_lettered += len(dead)
            except DelayQueueError as e:
                self.result.errors.append(f"dead-letter queue: {e}")
                for state, entry in dead:
                    back = dataclasses.replace(entry, delay_seconds=c.EMIT_RETRY_MAX_SECONDS)
                    state.retries.append(_Retry(back, why=f"dead-letter queue: {e}"))
        retries = [(state, retry) for state in pending for retry in state.retries]
        if not retries:
            return
        owners = {id(retry.entry): (state, retry) for state, retry in retries}
        unsent = self.services.delay_queue.send_each([r.entry for _, r in retries], self.deadline)
        self.result.requeued += len(retries) - len(unsent)
        failed: set[str] = set()
        refused: list[tuple[_SqsMessageState, QueueEntry]] = []
        for entry, error in unsent:
            state, retry = owners[id(entry)]
            self.result.errors.append(f"{state.message.message_id}: not sent back: {error}")
            if isinstance(error, RetriesExhaustedError):
                failed.add(state.message.message_id)
                continue
            detail = f"the delay queue refused it back ({error}); going back for: {retry.why}"
            text = dead_letter_text(entry.text, retry.reason, detail, self.clock())
            refused.append((state, dataclasses.replace(entry, delay_seconds=0, text=text)))
        if refused:
            try:
                self.services.dead_letters.send_entries([e for _, e in refused], self.deadline)
                self.result.dead_lettered += len(refused)
            except DelayQueueError as e:
                self.result.errors.append(f"dead-letter queue: {e}")
                failed.update(state.message.message_id for state, _ in refused)
        for state in pending:
            if state.message.message_id in failed:
                self.fail_back_off(state)

    def fail_back_off(self, state: _SqsMessageState) -> None:
        """Report an SQS message failed, visible again after a short back-off (2, 4, 8 ...
        seconds by receive count) rather than the queue's visibility timeout (minutes). SQS
        counts the receive towards the dead-letter queue."""
        message = state.message
        seconds = min(2**message.receive_count, c.EMIT_RETRY_MAX_SECONDS)
        try:
            self.services.delay_queue.source(message.source_arn).change_visibility(
                message.receipt_handle, seconds, self.deadline
            )
        except DelayQueueError as e:
            self.result.errors.append(f"{message.message_id}: back-off not set: {e}")
        self.result.failed.append(message.message_id)

    def record_stats(self) -> None:
        """Count deliveries into the container's statistics (``producing.record_deliveries``)."""
        self.result.errors.extend(
            record_deliveries(
                self.services.stats,
                self.result.deliveries,
                self.services.store,
                self.clock(),
                self.deadline,
            )
        )
