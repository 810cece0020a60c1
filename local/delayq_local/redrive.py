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
    delay queue when their envelope decodes and their target is now allowed (the emitter's
    screen, ``emitter.screen``).

A message is deleted from its source only after its destination accepted it: a refused
write or a crash leaves it where it was, and at worst it moves twice, carrying the same
``delay-id``. Whatever a run read and did not move (failures, a dry run's whole read) is
made visible again when the run ends. A pacer (``delayq_local.pacing``, a token bucket) paces
the moves (messages per second). The command line builds the services with
:func:`redrive_services`.

Operator tooling (``delayq redrive``): in the CLI package, not in the Lambda layer (no function
uses it).
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
from typing import TYPE_CHECKING, Any

from delayq import constants as c
from delayq.clock import Clock, Sleep, system_clock
from delayq.emitter import DELAY_QUEUE_RECORD_KEYS, delay_queue_rejection, screen
from delayq.envelope import BodyEntry, decode_body
from delayq.exceptions import ConfigurationError, DelayQueueError, EnvelopeError
from delayq.ingest import IngestServices, ingest_batch, parse_batch
from delayq.payloads import parse_ref
from delayq.records import Reason, RejectedRecord, Rejection
from delayq.retry import AWS_ERRORS, Backoff, Deadline, retry_call
from delayq.runtime import client, ingest_services
from delayq.settings import Settings
from delayq_local.pacing import Pacer
from delayq_local.source_queue import SourceMessage, SourceQueue
from delayq_local.stream_failures import SEND_CHUNK, requeue_failed_batches

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "BATCH_SECONDS",
    "MAX_WAIT_SECONDS",
    "RedriveReport",
    "RedriveServices",
    "RedriveSource",
    "redrive",
    "redrive_services",
]

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


@dataclass(frozen=True)
class RedriveServices:
    """The clients and adapters a redrive uses."""

    sqs: SQSClient  # reads and deletes the source queue
    s3: S3Client  # reads oversize rejected records (``record_ref``)
    ingest: IngestServices  # the destinations: delay queue, store, reject queue, payloads
    backoff: Backoff = field(default_factory=Backoff)


def redrive_services(settings: Settings) -> RedriveServices:
    """What a redrive (``delayq redrive``) uses: its source queue, the oversize rejected
    records, and ingest's destinations (table, queues and bucket must be set), built with the
    layer's ``runtime``. Its SQS client reads for a long poll's wait longer than the other
    calls' read timeout."""
    read_timeout = settings.aws_read_timeout_seconds + MAX_WAIT_SECONDS
    return RedriveServices(
        sqs=client("sqs", settings.with_overrides(aws_read_timeout_seconds=read_timeout)),
        s3=client("s3", settings),
        ingest=ingest_services(settings),
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
    pacer = (
        None
        if dry_run or rate_per_second is None
        else Pacer(rate_per_second, clock=clock, sleep=sleep)
    )
    batch_size = c.SQS_BATCH_ENTRIES
    if pacer is not None:
        batch_size = min(batch_size, int(pacer.capacity))

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
            if pacer is not None:
                pacer.take(want)
            run.hold_ends_ms = None
            deadline = run.deadline()
            received_ms = run.clock()
            received = run.source.receive(want, hold_seconds, wait_seconds, deadline)
            run.hold_ends_ms = received_ms + hold_seconds * 1000
            fresh = run.admit(received)
            if pacer is not None:
                pacer.give_back(want - len(fresh))
            if not fresh:
                break
            run.taken += len(fresh)
            process(run, fresh)
            if progress is not None:
                progress(run.report, run.taken)
    finally:
        run.release()
        if pacer is not None:
            run.report.waited_seconds = pacer.waited_seconds
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
    (``delayq_local.stream_failures``); ``limit`` counts objects (batches)."""
    settings.require("payload_bucket", "delay_queue_url")
    _check_options(
        RedriveSource.CLEANUP_FAILURES,
        settings.payload_bucket,
        limit=limit,
        rate_per_second=rate_per_second,
        hold_seconds=1,
        wait_seconds=0,
    )
    pacer = (
        None
        if dry_run or rate_per_second is None
        else Pacer(
            rate_per_second, capacity=max(rate_per_second, SEND_CHUNK), clock=clock, sleep=sleep
        )
    )
    outcome = requeue_failed_batches(
        s3=services.s3,
        bucket=settings.payload_bucket,
        delay_queue=services.ingest.delay_queue,
        backoff=services.backoff,
        limit=limit,
        pace=None if pacer is None else pacer.take,
        dry_run=dry_run,
        clock=clock,
    )
    report = RedriveReport(RedriveSource.CLEANUP_FAILURES, dry_run)
    report.moved, report.failed = outcome.moved, outcome.failed
    report.errors.extend(outcome.errors)
    if pacer is not None:
        report.waited_seconds = pacer.waited_seconds
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
    # brings one of them, it is this run's, not a new reject, and is left for a later run.
    put_back: set[str] = field(default_factory=set)
    taken: int = 0  # source messages read and dealt with (what ``limit`` counts)
    # When the hold of the batch in hand ends (None: between batches).
    hold_ends_ms: int | None = None

    @property
    def dry_run(self) -> bool:
        return self.report.dry_run

    def deadline(self) -> Deadline:
        """``BATCH_SECONDS`` for one call with its retries, ending one call's longest time
        (connect + read timeout) before the hold of the batch in hand ends: past the hold,
        another reader may receive a message, and a delete with this run's receipt handle
        would leave it there to be moved again."""
        end = self.clock() + int(BATCH_SECONDS * 1000)
        if self.hold_ends_ms is not None:
            call_seconds = (
                self.settings.aws_connect_timeout_seconds + self.settings.aws_read_timeout_seconds
            )
            end = min(end, self.hold_ends_ms - int(call_seconds * 1000))
        return Deadline(lambda: end - self.clock(), safety_ms=0)

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
            self.put_back.update(_fingerprint(r.record) for _, r in rejected)
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
            self.put_back.update(_fingerprint(r.record) for r in rejections)
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
    """Kafka records are ingested again; emitter rejects go through the emitter's screen."""
    records: list[tuple[SourceMessage, Any]] = []
    envelopes: list[tuple[SourceMessage, Any]] = []
    for message in batch:
        try:
            record = run.original_record(message)
        except _UnusableMessageError as e:
            run.fail(message, str(e))
            continue
        if _fingerprint(record) in run.put_back:
            run.skip()
        elif isinstance(record, Mapping) and set(record) == DELAY_QUEUE_RECORD_KEYS:
            envelopes.append((message, record))
        else:
            records.append((message, record))
    run.reingest(records)
    ready: list[tuple[SourceMessage, list[BodyEntry]]] = []
    rejected: list[tuple[SourceMessage, Rejection]] = []
    for message, record in envelopes:
        sqs_message_id, body = record["sqs_message_id"], record["body"]
        try:
            entries = decode_body(body)
        except EnvelopeError as e:
            rejection = delay_queue_rejection(Reason.BAD_ENVELOPE, str(e), sqs_message_id, body)
            rejected.append((message, rejection))
            continue
        refusals = [
            v for v in (screen(e, run.settings) for e in entries) if isinstance(v, RejectedRecord)
        ]
        if refusals:
            # The body stays whole, rejected for its first entry that is not ours, else for
            # its first target off the allow-list.
            refusal = min(refusals, key=lambda v: v.reason is not Reason.BAD_ENVELOPE)
            rejection = delay_queue_rejection(refusal.reason, refusal.detail, sqs_message_id, body)
            rejected.append((message, rejection))
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
