"""SQS adapters: the delay queue, the tick queue and the reject (dead-letter) queue. The queue
an operator command reads (a redrive's source, the reject listing) is the CLI's
(``delayq_local.source_queue``), built on :func:`attempt_batch`.

The batch calls (``SendMessageBatch``, ``DeleteMessageBatch``,
``ChangeMessageVisibilityBatch``) take 10 entries and fail per entry with HTTP 200: only the
entries in ``Failed[]`` are tried again. An entry failing through the sender's fault is not
retried.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from delayq import buckets
from delayq import constants as c
from delayq.envelope import Envelope, bundle_bytes, encode_bundle
from delayq.exceptions import DelayQueueError, QueueError
from delayq.payloads import PayloadStore
from delayq.records import DelayRequest, Rejection
from delayq.retry import AWS_ERRORS, Backoff, Deadline, is_retryable, retry_call, retry_partial

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "DelayQueue",
    "Outgoing",
    "QueueEntry",
    "RejectQueue",
    "SqsQueue",
    "TickQueue",
    "attempt_batch",
]

_Item = TypeVar("_Item")


@dataclass(frozen=True)
class Outgoing:
    """One SQS entry before sending."""

    body: str
    delay_seconds: int = 0


class SqsQueue:
    """One queue: batched sends with per-entry retries. The client is injected."""

    def __init__(
        self,
        client: SQSClient,
        url: str,
        backoff: Backoff | None = None,
        send_workers: int = 8,
        executor: Executor | None = None,
    ) -> None:
        self._client = client
        self.url = url
        self._backoff = backoff or Backoff()
        # ``executor``: where concurrent sends run (default: a pool of ``send_workers``).
        self._pool = executor or ThreadPoolExecutor(max_workers=max(1, send_workers))

    def send(self, operation: str, entries: Sequence[Outgoing], deadline: Deadline) -> None:
        """Send every entry, at most 10 (and 256 KiB of bodies) a call, several calls at a
        time, retrying only the entries SQS did not take. Raises the first failure once every
        call has finished, so no send is left running behind the caller."""
        batches = [list(enumerate(batch)) for batch in _batches(entries)]
        if len(batches) == 1:
            retry_partial(operation, self._send_chunk, batches[0], self._backoff, deadline)
            return
        futures = [
            self._pool.submit(
                retry_partial, operation, self._send_chunk, batch, self._backoff, deadline
            )
            for batch in batches
        ]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _send_chunk(self, chunk: list[tuple[int, Outgoing]]) -> list[tuple[int, Outgoing]]:
        retry, refused = attempt_batch(
            self._client.send_message_batch,
            self.url,
            chunk,
            lambda o: {"MessageBody": o.body, "DelaySeconds": o.delay_seconds},
            f"SendMessageBatch to {self.url} failed",
        )
        if refused:
            message = refused[0][1].get("Message")
            raise QueueError(f"SQS refused {len(refused)} entr(y/ies): {message}")
        return retry

    def send_each(
        self, operation: str, entries: Sequence[Outgoing], deadline: Deadline
    ) -> list[DelayQueueError | None]:
        """:meth:`send` that never raises: each entry's error, None once SQS took it. An entry
        SQS refuses fails alone; a call refused, or out of retries or time, fails the entries
        of its batch not taken yet (a :class:`RetriesExhaustedError` when a retry may work)."""
        outcome: list[DelayQueueError | None] = [None] * len(entries)
        batches: list[list[tuple[int, Outgoing]]] = []
        start = 0
        for batch in _batches(entries):
            batches.append([(start + i, o) for i, o in enumerate(batch)])
            start += len(batch)

        def run(batch: list[tuple[int, Outgoing]]) -> None:
            pending = {i for i, _ in batch}

            def attempt(
                chunk: list[tuple[int, tuple[int, Outgoing]]],
            ) -> list[tuple[int, tuple[int, Outgoing]]]:
                retry, refused = attempt_batch(
                    self._client.send_message_batch,
                    self.url,
                    chunk,
                    lambda p: {"MessageBody": p[1].body, "DelaySeconds": p[1].delay_seconds},
                    f"SendMessageBatch to {self.url} failed",
                )
                for (index, _), failure in refused:
                    code, message = failure.get("Code"), failure.get("Message")
                    outcome[index] = QueueError(f"SQS refused the entry: {code}: {message}")
                pending.clear()
                pending.update(i for i, _ in retry)
                return retry

            try:
                retry_partial(
                    operation, attempt, [(i, (i, o)) for i, o in batch], self._backoff, deadline
                )
            except DelayQueueError as e:
                for index in pending:
                    outcome[index] = e

        if len(batches) == 1:
            run(batches[0])
        else:
            for future in [self._pool.submit(run, batch) for batch in batches]:
                future.result()
        return outcome

    def change_visibility(self, receipt_handle: str, seconds: int, deadline: Deadline) -> None:
        """Hide a received message for ``seconds`` more (re-delay without a new send)."""
        try:
            retry_call(
                "change visibility",
                lambda: self._client.change_message_visibility(
                    QueueUrl=self.url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds
                ),
                self._backoff,
                deadline,
            )
        except AWS_ERRORS as e:
            raise QueueError(f"ChangeMessageVisibility failed: {e}") from e


def attempt_batch(
    call: Callable[..., Any],
    url: str,
    chunk: Sequence[tuple[int, _Item]],
    fields: Callable[[_Item], Mapping[str, Any]],
    call_failed: str,
) -> tuple[list[tuple[int, _Item]], list[tuple[_Item, Mapping[str, Any]]]]:
    """One attempt of a batch call on ``chunk`` (each item's entry: its ``Id`` and
    ``fields``), for ``retry_partial``: the entries to try again (SQS failed them, not
    through the sender's fault), and those refused for good, each with its ``Failed[]``
    entry. A call failing as a whole is raised as it is when a retry may succeed, else as a
    :class:`QueueError` (``"{call_failed}: {error}"``)."""
    try:
        response = call(QueueUrl=url, Entries=[{"Id": str(i), **fields(item)} for i, item in chunk])
    except AWS_ERRORS as e:
        if is_retryable(e):
            raise
        raise QueueError(f"{call_failed}: {e}") from e
    failed = {f["Id"]: f for f in response.get("Failed", [])}
    retry: list[tuple[int, _Item]] = []
    refused: list[tuple[_Item, Mapping[str, Any]]] = []
    for i, item in chunk:
        failure = failed.get(str(i))
        if failure is None:
            continue
        if failure.get("SenderFault"):
            refused.append((item, failure))
        else:
            retry.append((i, item))
    return retry, refused


def _batches(entries: Sequence[Outgoing]) -> Iterator[list[Outgoing]]:
    """Consecutive entries grouped under both SendMessageBatch limits. SQS refuses a whole call
    whose bodies add up to more than the limit (BatchRequestTooLong), even when every entry
    is within the message limit."""
    batch: list[Outgoing] = []
    size = 0
    for entry in entries:
        entry_size = len(entry.body.encode())
        if batch and (
            len(batch) == c.SQS_BATCH_ENTRIES or size + entry_size > c.SQS_MAX_BATCH_BYTES
        ):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry_size
    if batch:
        yield batch


@dataclass(frozen=True)
class QueueEntry:
    """One delay message to queue: its encoded single envelope, the DelaySeconds it waits,
    the bytes of its offloaded value (what delivering it will fetch), and its priority (which
    delay queue it goes to)."""

    delay_seconds: int
    text: str
    offloaded_bytes: int = 0
    priority: str = c.PRIORITY_NORMAL


class DelayQueue:
    """The SQS standard queue where a message waits its last (at most 15) minutes.

    Requests that get the same DelaySeconds travel together: bundles (``docs/internals.md``)
    of at most ``bundle_max_bytes`` (default: one 64 KiB billing chunk),
    ``bundle_max_messages``, and ``BUNDLE_MAX_OFFLOADED_BYTES`` of offloaded values counted at
    their real size (a pointer is small; the value it points at is not). A request larger
    than a bundle goes alone, as a single envelope.

    Each priority has its own queue (``by_priority``; ``queue`` is the normal one, and a
    priority without a queue of its own uses it): a high-priority message never waits behind
    a burst of low-priority ones in the same queue. The same bundling serves the delay
    queue's dead-letter queue (the emitter dead-letters messages with their reason, see
    ``delayq.envelope.dead_letter_text``).
    """

    def __init__(
        self,
        queue: SqsQueue,
        lead_ms: int,
        *,
        bundle_max_bytes: int = c.DEFAULT_BUNDLE_MAX_BYTES,
        bundle_max_messages: int = c.DEFAULT_BUNDLE_MAX_MESSAGES,
        by_priority: Mapping[str, SqsQueue] | None = None,
    ) -> None:
        self.queue = queue
        self._by_priority = dict(by_priority or {})
        self._lead_ms = lead_ms
        self._max_bytes = bundle_max_bytes
        self._max_messages = max(1, bundle_max_messages)

    def delay_seconds(self, due_ms: int, now_ms: int) -> int:
        """DelaySeconds rounded down, so that SQS releases at or before due (minus the
        emitter's lead); the emitter holds the message the rest of the way."""
        return buckets.queue_delay_seconds(due_ms, now_ms, self._lead_ms)

    def of_priority(self, priority: str) -> SqsQueue:
        """The queue of a priority (the normal one when it has none of its own)."""
        return self._by_priority.get(priority, self.queue)

    def source(self, arn: str) -> SqsQueue:
        """The queue an SQS event record came from (its ``eventSourceARN``)."""
        name = arn.rpartition(":")[2]
        for queue in (self.queue, *self._by_priority.values()):
            if name and queue.url.rstrip("/").endswith(f"/{name}"):
                return queue
        return self.queue

    def send(self, requests: Sequence[DelayRequest], now_ms: int, deadline: Deadline) -> None:
        """Queue each request in its priority's queue, released at or before its due time
        (or its release slot), in bundles."""
        self.send_entries(
            [
                QueueEntry(
                    self.delay_seconds(r.release_at_ms, now_ms),
                    Envelope(r).encode(),
                    r.offloaded_bytes,
                    r.priority,
                )
                for r in requests
            ],
            deadline,
        )

    def send_entries(self, entries: Sequence[QueueEntry], deadline: Deadline) -> None:
        """Queue encoded single envelopes, each with its DelaySeconds, bundled by queue and
        DelaySeconds. A failed SendMessageBatch entry is a whole bundle: it is sent again
        whole. Raises the first failure once every queue's sends have finished."""
        groups: dict[SqsQueue, dict[int, list[QueueEntry]]] = {}
        for entry in entries:
            by_delay = groups.setdefault(self.of_priority(entry.priority), {})
            by_delay.setdefault(entry.delay_seconds, []).append(entry)
        errors: list[DelayQueueError] = []
        for queue, by_delay in groups.items():
            outgoing = [
                Outgoing(encode_bundle([e.text for e in bundle]), delay_seconds)
                for delay_seconds, group in by_delay.items()
                for bundle in self._bundles(group)
            ]
            try:
                queue.send("send to delay queue", outgoing, deadline)
            except DelayQueueError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def send_each(
        self, entries: Sequence[QueueEntry], deadline: Deadline
    ) -> list[tuple[QueueEntry, DelayQueueError]]:
        """:meth:`send_entries` that never raises: the entries not queued, each with why (all
        the entries of a bundle SQS did not take). Every other entry is on the queue."""
        groups: dict[SqsQueue, dict[int, list[QueueEntry]]] = {}
        for entry in entries:
            by_delay = groups.setdefault(self.of_priority(entry.priority), {})
            by_delay.setdefault(entry.delay_seconds, []).append(entry)
        unsent: list[tuple[QueueEntry, DelayQueueError]] = []
        for queue, by_delay in groups.items():
            bundles = [
                (delay_seconds, bundle)
                for delay_seconds, group in by_delay.items()
                for bundle in self._bundles(group)
            ]
            outgoing = [Outgoing(encode_bundle([e.text for e in b]), d) for d, b in bundles]
            errors = queue.send_each("send to delay queue", outgoing, deadline)
            for (_, bundle), error in zip(bundles, errors, strict=True):
                if error is not None:
                    unsent.extend((entry, error) for entry in bundle)
        return unsent

    def _bundles(self, entries: Sequence[QueueEntry]) -> Iterator[list[QueueEntry]]:
        """Consecutive entries packed under the bundle caps (encoded envelopes are ASCII:
        characters are bytes)."""
        bundle: list[QueueEntry] = []
        size = offloaded = 0
        for entry in entries:
            if bundle and (
                len(bundle) == self._max_messages
                or bundle_bytes(size + len(entry.text), len(bundle) + 1) > self._max_bytes
                or offloaded + entry.offloaded_bytes > c.BUNDLE_MAX_OFFLOADED_BYTES
            ):
                yield bundle
                bundle, size, offloaded = [], 0, 0
            bundle.append(entry)
            size += len(entry.text)
            offloaded += entry.offloaded_bytes
        if bundle:
            yield bundle


class TickQueue:
    """The FIFO queue of scheduler ticks: one message per tick period, whoever sends it."""

    def __init__(self, client: SQSClient, url: str, backoff: Backoff | None = None) -> None:
        self._client = client
        self.url = url
        self._backoff = backoff or Backoff()

    def put_tick(self, index: int, tick_seconds: int, now_ms: int, deadline: Deadline) -> str:
        """Send the tick; FIFO de-duplication drops repeats within 5 minutes. Returns its id."""
        dedup = buckets.tick_dedup_id(index)
        body = json.dumps({"tick": index, "tick_seconds": tick_seconds, "at_ms": now_ms})
        try:
            retry_call(
                "send tick",
                lambda: self._client.send_message(
                    QueueUrl=self.url,
                    MessageBody=body,
                    MessageGroupId=c.TICK_GROUP_ID,
                    MessageDeduplicationId=dedup,
                ),
                self._backoff,
                deadline,
            )
        except AWS_ERRORS as e:
            raise QueueError(f"sending tick {dedup} failed: {e}") from e
        return dedup


class RejectQueue:
    """Dead-letter destination for rejected input: reason, coordinates and original record.

    A record too large for an SQS body is kept whole in S3 and the body points at it.
    """

    def __init__(self, queue: SqsQueue, payloads: PayloadStore) -> None:
        self.queue = queue
        self._payloads = payloads

    def send(self, rejections: Sequence[Rejection], now_ms: int, deadline: Deadline) -> None:
        """Send every rejection; nothing about the original record is dropped."""
        entries = [Outgoing(self._body(r, now_ms, deadline)) for r in rejections]
        self.queue.send("send to reject queue", entries, deadline)

    def _body(self, rejection: Rejection, now_ms: int, deadline: Deadline) -> str:
        body: dict[str, Any] = {
            "reason": str(rejection.reason),
            "detail": rejection.detail,
            "source": {
                "topic": rejection.topic,
                "partition": rejection.partition,
                "offset": rejection.offset,
            },
            "record": rejection.record,
            "record_ref": None,
            "rejected_ms": now_ms,
        }
        text = json.dumps(body, separators=(",", ":"), default=repr)
        if len(text.encode()) <= c.SQS_MAX_MESSAGE_BYTES:
            return text
        original = json.dumps(rejection.record, separators=(",", ":"), default=repr).encode()
        body["record"] = None
        body["record_ref"] = self._payloads.put_rejected(rejection, original, deadline)
        return json.dumps(body, separators=(",", ":"))
