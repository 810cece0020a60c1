"""S3 claim-check: large values wait in S3; the store and the queue carry a pointer.

Objects live under ``payloads/`` and ``rejected/`` (original records too large for a
dead-letter body). Nothing here deletes a payload: a message may have copies (at-least-once
duplicates, retries, a dead-letter queue, a redrive days later) and each must find its value.
The bucket's lifecycle rule expires them after a retention that the template checks against
the longest a copy can live: the maximum delay, the TTL grace, TTL's own lag and the
dead-letter retention.
"""

from __future__ import annotations

import dataclasses
import hashlib
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from delayq import constants as c
from delayq.exceptions import PayloadMissingError, PayloadStoreError
from delayq.records import DelayRequest
from delayq.retry import AWS_ERRORS, Backoff, Deadline, retry_call

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from delayq.records import Rejection

__all__ = [
    "PAYLOAD_PREFIX",
    "REJECTED_PREFIX",
    "PayloadStore",
    "parse_ref",
    "payload_key",
    "written_no_earlier_ms",
]

PAYLOAD_PREFIX = "payloads/"
REJECTED_PREFIX = "rejected/"


def parse_ref(ref: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key)."""
    bucket, _, key = ref.removeprefix("s3://").partition("/")
    if not ref.startswith("s3://") or not bucket or not key:
        raise PayloadStoreError(f"not an s3:// reference: {ref!r}")
    return bucket, key


def payload_key(request: DelayRequest) -> str:
    """The object of one version of a message: one per record (the message's own, or the
    reschedule that made a copy), so that no record's value ever overwrites another's."""
    return _version_key(request.delay_id, request.moved_src or request.src)


def written_no_earlier_ms(version: DelayRequest) -> int:
    """A time before which the object ``version`` points at was not written: the record that
    wrote it (the reschedule whose copy has its own object, else the message's record)."""
    if (
        version.moved_src
        and version.payload_ref
        and version.payload_ref.endswith(payload_key(version))
    ):
        return version.moved_ts_ms
    return version.ts_ms


def _version_key(delay_id: str, version_src: str) -> str:
    digest = hashlib.blake2b(version_src.encode(), digest_size=16).hexdigest()
    return f"{_id_prefix(delay_id)}r{digest}"


def _id_prefix(delay_id: str) -> str:
    digest = hashlib.sha256(delay_id.encode()).hexdigest()[:32]
    return f"{PAYLOAD_PREFIX}{digest}/"


class PayloadStore:
    """The claim-check bucket. The client is injected."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        backoff: Backoff | None = None,
        fetch_workers: int = c.EMIT_FETCH_WORKERS,
        executor: Executor | None = None,
    ) -> None:
        self._client = client
        self.bucket = bucket
        self._backoff = backoff or Backoff()
        # ``executor``: where fetches run (default: a pool of ``fetch_workers``).
        self._pool = executor or ThreadPoolExecutor(max_workers=max(1, fetch_workers))

    def offload(self, request: DelayRequest, deadline: Deadline) -> DelayRequest:
        """Put the value in S3; return the request carrying a pointer instead of the value."""
        key = payload_key(request)
        self._call(
            "put payload",
            lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=request.value or b""),
            deadline,
        )
        return dataclasses.replace(
            request,
            value=None,
            payload_ref=f"s3://{self.bucket}/{key}",
            offloaded_bytes=len(request.value or b""),
        )

    def renew(self, copy: DelayRequest, deadline: Deadline) -> DelayRequest:
        """Give a rescheduled copy an object of its own (a server-side CopyObject of the one
        it points at), whose lifecycle clock starts now."""
        key = payload_key(copy)
        source = self._own_key(copy)
        if key != source:
            self._call(
                "copy payload",
                lambda: self._client.copy_object(
                    Bucket=self.bucket, Key=key, CopySource={"Bucket": self.bucket, "Key": source}
                ),
                deadline,
            )
        return dataclasses.replace(copy, payload_ref=f"s3://{self.bucket}/{key}")

    def restore(self, request: DelayRequest, deadline: Deadline) -> DelayRequest:
        """Fetch the value a pointer refers to; requests without a pointer pass through.
        Raises :class:`PayloadMissingError` when the object is not there (no retry can help)
        and :class:`PayloadStoreError` when S3 could not be read."""
        if not request.payload_ref:
            return request
        key = self._own_key(request)
        try:
            response = self._call(
                "get payload",
                lambda: self._client.get_object(Bucket=self.bucket, Key=key),
                deadline,
            )
        except PayloadStoreError as e:
            if _missing(e.__cause__):
                raise PayloadMissingError(f"{request.payload_ref} does not exist") from e
            raise
        return dataclasses.replace(request, value=response["Body"].read())

    def submit_restore(self, request: DelayRequest, deadline: Deadline) -> Future[DelayRequest]:
        """:meth:`restore` on the store's fetch pool (the emitter fetches ahead of producing)."""
        return self._pool.submit(self.restore, request, deadline)

    def owns(self, request: DelayRequest) -> bool:
        """True when the request's pointer is one it may have: in this bucket, the object of
        its own record, of the reschedule that made it (a copy), or of an earlier version of
        its id (a copy sharing its original's object; objects written before versions were
        keyed by id and due time). A body forged onto the delay queue must not read other
        objects."""
        if not request.payload_ref:
            return False
        try:
            bucket, key = parse_ref(request.payload_ref)
        except PayloadStoreError:
            return False
        if bucket != self.bucket:
            return False
        if key in {payload_key(request), _version_key(request.delay_id, request.src)}:
            return True
        prefix = _id_prefix(request.delay_id)
        rest = key[len(prefix) :] if key.startswith(prefix) else ""
        if request.moved_src:
            return _is_version_name(rest) or rest.isdigit()
        return rest == str(request.due_ms)

    def _own_key(self, request: DelayRequest) -> str:
        if not self.owns(request):
            raise PayloadStoreError(
                f"payload_ref {request.payload_ref!r} is not this message's payload"
            )
        return parse_ref(request.payload_ref or "")[1]

    def put_rejected(self, rejection: Rejection, original: bytes, deadline: Deadline) -> str:
        """Keep an oversize rejected record whole; returns its ``s3://`` reference."""
        where = f"{rejection.topic}/{rejection.partition}/{rejection.offset}"
        digest = hashlib.sha256(original).hexdigest()[:16]
        key = f"{REJECTED_PREFIX}{where}-{digest}.json"
        self._call(
            "put rejected record",
            lambda: self._client.put_object(
                Bucket=self.bucket, Key=key, Body=original, ContentType="application/json"
            ),
            deadline,
        )
        return f"s3://{self.bucket}/{key}"

    def _call(self, operation: str, call: Any, deadline: Deadline) -> Any:
        try:
            return retry_call(operation, call, self._backoff, deadline)
        except AWS_ERRORS as e:
            raise PayloadStoreError(f"{operation}: {e}") from e


def _is_version_name(name: str) -> bool:
    return len(name) == 33 and name[0] == "r" and all(ch in "0123456789abcdef" for ch in name[1:])


def _missing(error: BaseException | None) -> bool:
    """S3's answer for an object that is not there (404 with the ListBucket grant)."""
    if not isinstance(error, ClientError):
        return False
    code = error.response.get("Error", {}).get("Code")
    return code in {"NoSuchKey", "404"}
