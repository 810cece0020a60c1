"""Stream batches the cleanup function gave up on: back into the pipeline.

The cleanup function's stream source retries a failing batch, then writes it to its
on-failure destination, the payload bucket: one object per batch under ``aws/lambda/``,
holding the invocation record and the batch itself (``payload.Records``, old images
included), as Lambda writes it for an S3 destination. An SQS destination would hold only the
batch's coordinates, and the TTL-deleted items are gone by then: the S3 object is the only
copy of those messages.

:func:`requeue_failed_batches` (``delayq redrive cleanup-failures``) sends every message of
those TTL removals to the delay queue (late, and possibly a second time with the same
``delay-id``: whether the scheduler had sent it is what the cleanup function could not find
out) and deletes an object only once its messages are queued.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from delayq import constants as c
from delayq.cleanup import is_ttl_removal
from delayq.clock import Clock
from delayq.exceptions import DelayQueueError, StoreError
from delayq.queues import DelayQueue
from delayq.records import DelayRequest
from delayq.retry import AWS_ERRORS, Backoff, Deadline, retry_call
from delayq.store import request_from_item

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "BATCH_SECONDS",
    "FAILED_BATCH_PREFIX",
    "SEND_CHUNK",
    "RequeueOutcome",
    "removed_messages",
    "requeue_failed_batches",
]

#: Where Lambda writes the failed batches of an event source mapping with an S3 destination.
FAILED_BATCH_PREFIX = "aws/lambda/"
#: Retry budget of the writes for one object.
BATCH_SECONDS = 60.0
#: Messages sent to the delay queue at a time (one pace step).
SEND_CHUNK = 10
_READ_ERRORS: tuple[type[Exception], ...] = (StoreError, ValueError, *AWS_ERRORS)
_WRITE_ERRORS: tuple[type[Exception], ...] = (DelayQueueError, *AWS_ERRORS)


def removed_messages(batch: Mapping[str, Any]) -> list[DelayRequest]:
    """The messages of the TTL removals in one on-failure object (other records: none).
    Raises :class:`StoreError` when the object is not such a record."""
    payload = batch.get("payload")
    records = payload.get("Records") if isinstance(payload, Mapping) else None
    if not isinstance(records, list):
        raise StoreError("not a failed stream batch: no payload.Records")
    out: list[DelayRequest] = []
    for record in records:
        if not isinstance(record, Mapping) or not is_ttl_removal(record):
            continue
        image = (record.get("dynamodb") or {}).get("OldImage") or {}
        if image.get("kind", {}).get("S") != c.KIND_MESSAGE:
            continue
        try:
            out.append(request_from_item(image))
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"a removed item is not a stored message: {e}") from e
    return out


@dataclass
class RequeueOutcome:
    """What :func:`requeue_failed_batches` did (in a dry run: what it would have done)."""

    moved: int = 0  # messages queued (their objects deleted)
    failed: int = 0  # messages (or unreadable objects) left where they were
    errors: list[str] = field(default_factory=list)


def requeue_failed_batches(
    *,
    s3: S3Client,
    bucket: str,
    delay_queue: DelayQueue,
    backoff: Backoff,
    limit: int | None,
    pace: Callable[[int], None] | None,
    dry_run: bool,
    clock: Clock,
) -> RequeueOutcome:
    """Queue the messages of up to ``limit`` failed batches (default: all) in ``bucket``;
    ``pace(n)`` waits until ``n`` more messages may go. A ``dry_run`` reads and counts but
    writes and deletes nothing. An object that cannot be read, or whose messages the delay
    queue refused, stays where it is."""
    outcome = RequeueOutcome()
    for index, key in enumerate(_keys(s3, bucket)):
        if limit is not None and index >= limit:
            break
        deadline = Deadline.after(BATCH_SECONDS)
        try:
            messages = removed_messages(_read_json(s3, bucket, key, backoff, deadline))
        except _READ_ERRORS as e:
            outcome.failed += 1
            outcome.errors.append(f"s3://{bucket}/{key}: {e}")
            continue
        if not dry_run:
            try:
                for start in range(0, len(messages), SEND_CHUNK):
                    chunk = messages[start : start + SEND_CHUNK]
                    if pace is not None:
                        pace(len(chunk))
                    delay_queue.send(chunk, clock(), deadline)
                retry_call(
                    "delete failed batch",
                    partial(s3.delete_object, Bucket=bucket, Key=key),
                    backoff,
                    deadline,
                )
            except _WRITE_ERRORS as e:
                outcome.failed += len(messages)
                outcome.errors.append(f"s3://{bucket}/{key}: {e}")
                continue
        outcome.moved += len(messages)
    return outcome


def _keys(s3: S3Client, bucket: str) -> Iterator[str]:
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=FAILED_BATCH_PREFIX):
        for item in page.get("Contents", []):
            yield str(item["Key"])


def _read_json(s3: S3Client, bucket: str, key: str, backoff: Backoff, deadline: Deadline) -> Any:
    response = retry_call(
        "read failed batch", partial(s3.get_object, Bucket=bucket, Key=key), backoff, deadline
    )
    return json.loads(response["Body"].read())
