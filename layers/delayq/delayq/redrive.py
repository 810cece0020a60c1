"""Redrive: move dead-lettered messages back into the pipeline after a fix.

Two sources (:class:`RedriveSource`):

``delay-dlq``
    The delay queue's dead-letter queue: envelopes and bundles the emitter failed to deliver
    ten times (the target cluster was down, a payload could not be read...). Every message
    goes back to the delay queue, delayed until its due time (at once when it is already due),
    bundled again by DelaySeconds. A bundle with an entry that is not ours stays whole.
``rejects``
    The reject queue: records ingest refused, with the original record inline or in S3
    (``record_ref``). They are ingested again under the current settings (after the
    allow-list or a limit was fixed); those still invalid go back to the reject queue with
    their new reason. Emitter rejects (a delay-queue body, not a Kafka record) go back to the
    delay queue when their envelope decodes and their target is now allowed.

A message is deleted from its source only after its destination accepted it: a refused
write or a crash leaves it where it was, and at worst it moves twice, carrying the same
``delay-id``. Whatever a run read and did not move (failures, a dry run's whole read) is
made visible again when the run ends. A token bucket paces the moves (messages per second).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq import constants as c
from delayq import runtime
from delayq.clock import Clock, Sleep, system_clock
from delayq.envelope import BodyEntry, decode_body
from delayq.exceptions import ConfigurationError, DelayQueueError, EnvelopeError, QueueError
from delayq.ingest import IngestServices, ingest_batch, parse_batch
from delayq.payloads import parse_ref
from delayq.records import Reason, Rejection
from delayq.retry import AWS_ERRORS, Backoff, Deadline, is_retryable, retry_call, retry_partial
from delayq.settings import Settings
from delayq.stream_failures import SEND_CHUNK, requeue_failed_batches

#: The keys of a reject the emitter wrote: the delay-queue message, not a Kafka record.
DELAY_QUEUE_RECORD_KEYS = frozenset({"sqs_message_id", "body"})
#: Retry budget of the writes of one batch.
BATCH_SECONDS = 60.0
#: SQS long polling limit.
MAX_WAIT_SECONDS = 20


class RedriveSource(enum.StrEnum):
    """Which dead-letter queue to move messages out of."""

    DELAY_DLQ = "delay-dlq"
    REJECTS = "rejects"
    # Not a queue: the cleanup stream source's failed batches in the payload bucket.
    CLEANUP_FAILURES = "cleanup-failures"


@dataclass
class RedriveReport:
    """What one run did (in a dry run: what it would have done).

    ``moved``: accepted by the pipeline again and deleted from the source. ``still_rejected``:
    (rejects) invalid under the current settings, back on the reject queue with the reason
    counted in ``reasons``. ``failed``: left on the source (unreadable, or the destination
    refused it), each with a line in ``errors``. ``skipped``: messages this run itself put on
    the source (re-rejects), left for a later run.
    """

    source: RedriveSource
    dry_run: bool
    moved: int = 0
    still_rejected: int = 0
    failed: int = 0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    waited_seconds: float = 0.0

    @property
    def handled(self) -> int:
        """Delay messages taken from the source and dealt with (a bundle counts each)."""
        return self.moved + self.still_rejected + self.failed

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for the command line)."""
        return {
            "source": str(self.source),
            "dry_run": self.dry_run,
            "moved": self.moved,
            "still_rejected": self.still_rejected,
            "failed": self.failed,
            "skipped": self.skipped,
            "reasons": dict(sorted(self.reasons.items())),
            "errors": list(self.errors),
            "waited_seconds": round(self.waited_seconds, 3),
        }


class TokenBucket:
    """Paces work to ``rate_per_second`` on average, in bursts of at most ``capacity``.

    The bucket starts full; ``take`` sleeps (on the injected ``sleep``) until enough tokens
    have accumulated on the injected ``clock`` (epoch milliseconds).
    """

    def __init__(
        self,
        rate_per_second: float,
        *,
        capacity: float | None = None,
        clock: Clock = system_clock,
        sleep: Sleep = time.sleep,
    ) -> None:
        if not (math.isfinite(rate_per_second) and rate_per_second > 0):
            raise ConfigurationError(f"rate_per_second must be > 0, not {rate_per_second!r}")
        size = rate_per_second if capacity is None else capacity
        if not (math.isfinite(size) and size > 0):
            raise ConfigurationError(f"capacity must be > 0, not {capacity!r}")
        self.rate = rate_per_second
        self.capacity = max(1.0, size)
        self.waited_seconds = 0.0
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.capacity
        self._at_ms = clock()

    def take(self, n: int) -> None:
        """Wait until ``n`` tokens are there, then use them."""
        if n > self.capacity:
            raise ValueError(f"cannot take {n} tokens at once from a bucket of {self.capacity}")
        self._refill()
        while self._tokens < n:
            pause = (n - self._tokens) / self.rate
            self._sleep(pause)
            self.waited_seconds += pause
            self._refill()
        self._tokens -= n

    def give_back(self, n: int) -> None:
        """Return tokens taken for work that did not happen."""
        self._tokens = min(self.capacity, self._tokens + n)

    def _refill(self) -> None:
        now = self._clock()
        gained = max(0, now - self._at_ms) * self.rate / 1000
        self._tokens = min(self.capacity, self._tokens + gained)
        self._at_ms = now


@dataclass(frozen=True)
class SourceMessage:
    """One message read from the source queue."""

    message_id: str
    receipt_handle: str
    body: str


class SourceQueue:
    """The queue a redrive reads: receive (hidden for a while), delete, make visible again.

    Per-entry failures of the batch calls are retried when SQS says they may succeed later
    and reported (never raised) otherwise: the message then simply stays on the queue.
    """

    def __init__(self, client: Any, url: str, backoff: Backoff | None = None) -> None:
        self._client = client
        self.url = url
        self._backoff = backoff or Backoff()

    def receive(
        self, max_messages: int, hold_seconds: int, wait_seconds: int, deadline: Deadline
    ) -> list[SourceMessage]:
        """Up to ``max_messages``, hidden from other readers for ``hold_seconds``."""
        try:
            response = retry_call(
                "receive from source",
                lambda: self._client.receive_message(
                    QueueUrl=self.url,
                    MaxNumberOfMessages=max_messages,
                    VisibilityTimeout=hold_seconds,
                    WaitTimeSeconds=wait_seconds,
                ),
                self._backoff,
                deadline,
            )
        except AWS_ERRORS as e:
            raise QueueError(f"ReceiveMessage from {self.url} failed: {e}") from e
        return [
            SourceMessage(m["MessageId"], m["ReceiptHandle"], m["Body"])
            for m in response.get("Messages", [])
        ]

    def delete(self, messages: Sequence[SourceMessage], deadline: Deadline) -> list[str]:
        """Delete messages; returns one line per message that could not be deleted."""
        return self._per_entry(
            "delete from source", self._client.delete_message_batch, messages, {}, deadline
        )

    def release(self, messages: Sequence[SourceMessage], deadline: Deadline) -> list[str]:
        """Make messages visible again now; returns one line per failure."""
        return self._per_entry(
            "release to source",
            self._client.change_message_visibility_batch,
            messages,
            {"VisibilityTimeout": 0},
            deadline,
        )

    def _per_entry(
        self,
        operation: str,
        call: Callable[..., Any],
        messages: Sequence[SourceMessage],
        extra: Mapping[str, Any],
        deadline: Deadline,
    ) -> list[str]:
        problems: list[str] = []

        def attempt(chunk: list[tuple[int, SourceMessage]]) -> list[tuple[int, SourceMessage]]:
            try:
                response = call(
                    QueueUrl=self.url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m.receipt_handle, **extra} for i, m in chunk
                    ],
                )
            except AWS_ERRORS as e:
                if is_retryable(e):
                    raise
                raise QueueError(f"{operation} ({self.url}): {e}") from e
            failed = {f["Id"]: f for f in response.get("Failed", [])}
            retry: list[tuple[int, SourceMessage]] = []
            for i, m in chunk:
                failure = failed.get(str(i))
                if failure is None:
                    continue
                if failure.get("SenderFault"):
                    problems.append(
                        f"{m.message_id}: {operation}: {failure.get('Code')}: "
                        f"{failure.get('Message')}"
                    )
                else:
                    retry.append((i, m))
            return retry

        for start in range(0, len(messages), c.SQS_BATCH_ENTRIES):
            chunk = list(enumerate(messages[start : start + c.SQS_BATCH_ENTRIES]))
            try:
                retry_partial(operation, attempt, chunk, self._backoff, deadline)
            except DelayQueueError as e:
                problems.extend(f"{m.message_id}: {operation}: {e}" for _, m in chunk)
        return problems


@dataclass(frozen=True)
class RedriveServices:
    """The clients and adapters a redrive uses."""

    sqs: Any  # reads and deletes the source queue
    s3: Any  # reads oversize rejected records (``record_ref``)
    ingest: IngestServices  # the destinations: delay queue, store, reject queue, payloads
    backoff: Backoff = field(default_factory=Backoff)


def redrive_services(settings: Settings) -> RedriveServices:
    """Build the services from settings (table, queues and bucket must be set)."""
    return RedriveServices(
        sqs=runtime.client("sqs", settings),
        s3=runtime.client("s3", settings),
        ingest=runtime.ingest_services(settings),
    )


def redrive(
    source: RedriveSource | str,
    *,
    settings: Settings,
    services: RedriveServices,
    source_url: str | None = None,
    limit: int | None = None,
    rate_per_second: float | None = None,
    dry_run: bool = False,
    hold_seconds: int = 300,
    wait_seconds: int = 1,
    clock: Clock = system_clock,
    sleep: Sleep = time.sleep,
    progress: Callable[[RedriveReport, int], None] | None = None,
) -> RedriveReport:
    """Move up to ``limit`` source messages (default: all) out of a dead-letter queue; a
    bundle is one source message, and the report counts each delay message in it.

    ``source_url`` defaults to ``settings.reject_queue_url`` for ``rejects``; the delay
    queue's dead-letter queue has no setting and must be given. ``rate_per_second`` paces the
    moves (token bucket, bursts of at most one second's worth, 10 at most). A ``dry_run``
    reads and classifies but writes nothing. Messages read are hidden from other readers for
    ``hold_seconds`` and, unless moved, made visible again when the run ends. The run stops
    at ``limit``, or when a receive (long polling ``wait_seconds``) brings nothing new.
    ``progress`` is called after each batch with the report so far and the source messages
    read.
    """
    kind = _source_kind(source)
    if kind is RedriveSource.CLEANUP_FAILURES:
        return _stream_failures(
            settings=settings,
            services=services,
            limit=limit,
            rate_per_second=rate_per_second,
            dry_run=dry_run,
            clock=clock,
            sleep=sleep,
        )
    url = source_url or _default_url(kind, settings)
    _check_options(
        kind,
        url,
        limit=limit,
        rate_per_second=rate_per_second,
        hold_seconds=hold_seconds,
        wait_seconds=wait_seconds,
    )
    bucket = (
        None
        if dry_run or rate_per_second is None
        else TokenBucket(rate_per_second, clock=clock, sleep=sleep)
    )
    batch_size = c.SQS_BATCH_ENTRIES
    if bucket is not None:
        batch_size = min(batch_size, int(bucket.capacity))

    run = _Run(
        settings,
        services,
        SourceQueue(services.sqs, url, services.backoff),
        clock,
        RedriveReport(kind, dry_run),
    )
    process = _PROCESS[kind]
    try:
        while limit is None or run.taken < limit:
            want = batch_size if limit is None else min(batch_size, limit - run.taken)
            if bucket is not None:
                bucket.take(want)
            fresh = run.admit(run.source.receive(want, hold_seconds, wait_seconds, run.deadline()))
            if bucket is not None:
                bucket.give_back(want - len(fresh))
            if not fresh:
                break
            run.taken += len(fresh)
            process(run, fresh)
            if progress is not None:
                progress(run.report, run.taken)
    finally:
        run.release()
        if bucket is not None:
            run.report.waited_seconds = bucket.waited_seconds
    return run.report


#: What reading an oversize rejected record from S3 may raise (it then stays on the source).
_RECORD_READ_ERRORS: tuple[type[Exception], ...] = (*AWS_ERRORS, DelayQueueError, ValueError)


def _stream_failures(
    *,
    settings: Settings,
    services: RedriveServices,
    limit: int | None,
    rate_per_second: float | None,
    dry_run: bool,
    clock: Clock,
    sleep: Sleep,
) -> RedriveReport:
    """``cleanup-failures``: the failed stream batches in the payload bucket
    (``delayq.stream_failures``); ``limit`` counts objects (batches)."""
    settings.require("payload_bucket", "delay_queue_url")
    _check_options(
        RedriveSource.CLEANUP_FAILURES,
        settings.payload_bucket,
        limit=limit,
        rate_per_second=rate_per_second,
        hold_seconds=1,
        wait_seconds=0,
    )
    bucket = (
        None
        if dry_run or rate_per_second is None
        else TokenBucket(
            rate_per_second, capacity=max(rate_per_second, SEND_CHUNK), clock=clock, sleep=sleep
        )
    )
    outcome = requeue_failed_batches(
        s3=services.s3,
        bucket=settings.payload_bucket,
        delay_queue=services.ingest.delay_queue,
        backoff=services.backoff,
        limit=limit,
        pace=None if bucket is None else bucket.take,
        dry_run=dry_run,
        clock=clock,
    )
    report = RedriveReport(RedriveSource.CLEANUP_FAILURES, dry_run)
    report.moved, report.failed = outcome.moved, outcome.failed
    report.errors.extend(outcome.errors)
    if bucket is not None:
        report.waited_seconds = bucket.waited_seconds
    return report


class _UnusableMessageError(Exception):
    """A source message that cannot be redriven as it is (it stays where it is)."""


@dataclass
class _Run:
    """The state of one redrive: what was read, what is still held, what was re-rejected."""

    settings: Settings
    services: RedriveServices
    source: SourceQueue
    clock: Clock
    report: RedriveReport
    held: dict[str, SourceMessage] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    # Fingerprints of the records this run put back on the reject queue: when a receive
    # brings one of them, it is ours, not a new reject, and is left for a later run.
    ours: set[str] = field(default_factory=set)
    taken: int = 0  # source messages read and dealt with (what ``limit`` counts)

    @property
    def dry_run(self) -> bool:
        return self.report.dry_run

    def deadline(self) -> Deadline:
        return Deadline.after(BATCH_SECONDS)

    def admit(self, received: Sequence[SourceMessage]) -> list[SourceMessage]:
        """Hold what was received; return the messages not seen before in this run."""
        fresh = []
        for message in received:
            self.held[message.message_id] = message
            if message.message_id not in self.seen:
                self.seen.add(message.message_id)
                fresh.append(message)
        return fresh

    def fail(self, message: SourceMessage, error: str, count: int = 1) -> None:
        self.report.failed += count
        self.report.errors.append(f"{message.message_id}: {error}")

    def skip(self) -> None:
        self.report.skipped += 1

    def settle(self, messages: Sequence[SourceMessage]) -> None:
        """The destination has them: delete them from the source. One that cannot be
        deleted stays there, to be moved again (a duplicate with the same delay-id)."""
        self.report.errors.extend(self.source.delete(messages, self.deadline()))
        for message in messages:
            self.held.pop(message.message_id, None)

    def release(self) -> None:
        """Make everything read and not moved visible again."""
        if self.held:
            self.report.errors.extend(
                self.source.release(list(self.held.values()), self.deadline())
            )
            self.held.clear()

    # --- destinations -----------------------------------------------------------------

    def requeue(self, ready: Sequence[tuple[SourceMessage, list[BodyEntry]]]) -> None:
        """Back to the delay queue, delayed until due; deleted from the source after. Each
        message starts afresh (its refused attempts and dead-letter reason dropped); a
        claim-check pointer stays a pointer."""
        if not ready:
            return
        if not self.dry_run:
            queue = self.services.ingest.delay_queue
            now_ms = self.clock()
            try:
                queue.send(
                    [
                        dataclasses.replace(e.request, attempts=0)
                        for _, entries in ready
                        for e in entries
                        if e.request is not None
                    ],
                    now_ms,
                    self.deadline(),
                )
            except DelayQueueError as e:
                for message, entries in ready:
                    self.fail(message, f"delay queue refused it: {e}", len(entries))
                return
            self.settle([m for m, _ in ready])
        self.report.moved += sum(len(entries) for _, entries in ready)

    def reject(self, rejected: Sequence[tuple[SourceMessage, Rejection]]) -> None:
        """Back to the reject queue with the new reason; deleted from the source after."""
        if not rejected:
            return
        if not self.dry_run:
            try:
                self.services.ingest.rejects.send(
                    [r for _, r in rejected], self.clock(), self.deadline()
                )
            except DelayQueueError as e:
                for message, _ in rejected:
                    self.fail(message, f"reject queue refused it: {e}")
                return
            self.ours.update(_fingerprint(r.record) for _, r in rejected)
            self.settle([m for m, _ in rejected])
        self.report.still_rejected += len(rejected)
        self.report.reasons.update(str(r.reason) for _, r in rejected)

    def reingest(self, pairs: Sequence[tuple[SourceMessage, Any]]) -> None:
        """Original Kafka records through ingest again, as one event under the current
        settings; the invalid ones ingest itself puts back on the reject queue."""
        if not pairs:
            return
        event = _kafka_event([record for _, record in pairs])
        if self.dry_run:
            rejections = parse_batch(event, self.settings, self.clock())[2]
        else:
            try:
                result = ingest_batch(
                    event,
                    settings=self.settings,
                    services=self.services.ingest,
                    clock=self.clock,
                    deadline=self.deadline(),
                )
            except DelayQueueError as e:
                for message, _ in pairs:
                    self.fail(message, f"ingest failed: {e}")
                return
            rejections = result.rejected
            self.ours.update(_fingerprint(r.record) for r in rejections)
            self.settle([m for m, _ in pairs])
        self.report.moved += len(pairs) - len(rejections)
        self.report.still_rejected += len(rejections)
        self.report.reasons.update(str(r.reason) for r in rejections)

    # --- reading the source -----------------------------------------------------------

    def original_record(self, message: SourceMessage) -> Any:
        """The original record of a reject-queue body (read from S3 for ``record_ref``)."""
        try:
            body = json.loads(message.body)
        except ValueError as e:
            raise _UnusableMessageError(f"not a reject-queue body: {e}") from e
        if not isinstance(body, Mapping) or "record" not in body:
            raise _UnusableMessageError("not a reject-queue body: no 'record'")
        ref = body.get("record_ref")
        return body["record"] if ref is None else self._read_ref(ref)

    def _read_ref(self, ref: Any) -> Any:
        if not isinstance(ref, str):
            raise _UnusableMessageError(f"record_ref {ref!r} is not an s3:// reference")
        try:
            bucket, key = parse_ref(ref)
            response = retry_call(
                "read rejected record",
                lambda: self.services.s3.get_object(Bucket=bucket, Key=key),
                self.services.backoff,
                self.deadline(),
            )
            return json.loads(response["Body"].read())
        except _RECORD_READ_ERRORS as e:
            raise _UnusableMessageError(f"record_ref {ref} cannot be read: {e}") from e


def _dead_letters(run: _Run, batch: Sequence[SourceMessage]) -> None:
    """Delay-queue bodies go back to the delay queue; a body that is not ours, or a bundle
    holding an entry that is not, stays (with the reason)."""
    ready: list[tuple[SourceMessage, list[BodyEntry]]] = []
    for message in batch:
        try:
            entries = decode_body(message.body)
        except EnvelopeError as e:
            run.fail(message, str(e))
            continue
        bad = [e.error for e in entries if e.request is None]
        if bad:
            run.fail(message, "; ".join(bad), len(entries))
        else:
            ready.append((message, entries))
    run.requeue(ready)


def _rejects(run: _Run, batch: Sequence[SourceMessage]) -> None:
    """Kafka records are ingested again; emitter rejects are screened like the emitter does."""
    records: list[tuple[SourceMessage, Any]] = []
    envelopes: list[tuple[SourceMessage, Any]] = []
    for message in batch:
        try:
            record = run.original_record(message)
        except _UnusableMessageError as e:
            run.fail(message, str(e))
            continue
        if _fingerprint(record) in run.ours:
            run.skip()
        elif isinstance(record, Mapping) and set(record) == DELAY_QUEUE_RECORD_KEYS:
            envelopes.append((message, record))
        else:
            records.append((message, record))
    run.reingest(records)
    ready: list[tuple[SourceMessage, list[BodyEntry]]] = []
    rejected: list[tuple[SourceMessage, Rejection]] = []
    for message, record in envelopes:
        try:
            entries = decode_body(record["body"])
        except EnvelopeError as e:
            rejected.append((message, _envelope_rejection(Reason.BAD_ENVELOPE, str(e), record)))
            continue
        bad = next((e for e in entries if e.request is None), None)
        off = next(
            (
                e.request
                for e in entries
                if e.request is not None and not run.settings.target_allowed(e.request.target)
            ),
            None,
        )
        if bad is not None:
            rejected.append((message, _envelope_rejection(Reason.BAD_ENVELOPE, bad.error, record)))
        elif off is not None:
            detail = f"target {off.target!r} is not on the emitter's allow-list"
            rejected.append(
                (message, _envelope_rejection(Reason.TARGET_NOT_ALLOWED, detail, record))
            )
        else:
            ready.append((message, entries))
    run.requeue(ready)
    run.reject(rejected)


_PROCESS: dict[RedriveSource, Callable[[_Run, Sequence[SourceMessage]], None]] = {
    RedriveSource.DELAY_DLQ: _dead_letters,
    RedriveSource.REJECTS: _rejects,
}


def _source_kind(source: RedriveSource | str) -> RedriveSource:
    try:
        return RedriveSource(source)
    except ValueError as e:
        choices = ", ".join(str(s) for s in RedriveSource)
        raise ConfigurationError(f"unknown redrive source {source!r}: one of {choices}") from e


def _check_options(
    kind: RedriveSource,
    url: str,
    *,
    limit: int | None,
    rate_per_second: float | None,
    hold_seconds: int,
    wait_seconds: int,
) -> None:
    problems: list[str] = []
    if not url:
        problems.append(f"redrive from {kind} needs source_url")
    if limit is not None and limit < 0:
        problems.append("limit must be >= 0")
    if rate_per_second is not None and not (math.isfinite(rate_per_second) and rate_per_second > 0):
        problems.append(f"rate_per_second must be > 0, not {rate_per_second!r}")
    if not 1 <= hold_seconds <= c.SQS_MAX_VISIBILITY_SECONDS:
        problems.append(f"hold_seconds must be 1..{c.SQS_MAX_VISIBILITY_SECONDS}")
    if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
        problems.append(f"wait_seconds must be 0..{MAX_WAIT_SECONDS}")
    if problems:
        raise ConfigurationError("; ".join(problems))


def _default_url(kind: RedriveSource, settings: Settings) -> str:
    """The reject queue is a setting; the delay queue's dead-letter queue is not."""
    return settings.reject_queue_url if kind is RedriveSource.REJECTS else ""


def _envelope_rejection(reason: Reason, detail: str, record: Any) -> Rejection:
    return Rejection(reason, detail, record, None, None, None)


def _kafka_event(records: Sequence[Any]) -> dict[str, Any]:
    """A Kafka event-source event holding ``records``, grouped by topic-partition."""
    grouped: dict[str, list[Any]] = {}
    for record in records:
        key = (
            f"{record.get('topic')}-{record.get('partition')}"
            if isinstance(record, Mapping)
            else "redrive"
        )
        grouped.setdefault(key, []).append(record)
    return {"eventSource": "delayq:redrive", "records": grouped}


def _fingerprint(record: Any) -> str:
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()
