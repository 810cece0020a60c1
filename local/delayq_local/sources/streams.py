"""The DynamoDB stream source: Lambda's poller for a table's stream.

Records are read through the DynamoDB Streams API (moto implements it), converted to Lambda's
event shape (binary attributes base64, creation time in epoch seconds, `eventSourceARN`), run
through the template's `FilterCriteria` (records that do not match are dropped, as Lambda does),
and delivered in order, `BatchSize` at a time. A failing batch is retried, bisected when
`BisectBatchOnFunctionError` is set, and after `MaximumRetryAttempts` or
`MaximumRecordAgeInSeconds` it goes to the on-failure destination and is skipped: an SQS queue
gets the batch's metadata only; an S3 bucket gets the metadata and the whole invocation record
(`payload`), under `aws/lambda/<mapping id>/<shard>/YYYY/MM/DD/<time>-<uuid>`, as Lambda
writes it.
With `ReportBatchItemFailures` the retry starts at the first failed record.

`inject()` adds records that did not come from the stream API (the TTL emulator's removals).
"""

from __future__ import annotations

import base64
import collections
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from delayq_local.sandbox import Invocation, LocalFunction
from delayq_local.sources.base import EventSource, failed_items
from delayq_local.specs import StreamEventSpec

log = logging.getLogger(__name__)

GET_RECORDS_LIMIT: Final = 1000
# Sequence numbers for injected records: above anything a local stream hands out.
_INJECTED_BASE: Final = 9 * 10**20


@dataclass
class _Pending:
    record: dict[str, Any]
    arrived: float


class StreamEventSource(EventSource):
    """Reads one table stream for one function."""

    def __init__(
        self,
        function: LocalFunction,
        spec: StreamEventSpec,
        streams: Any,
        *,
        region: str,
        poll_interval: float = 0.25,
        retry_backoff_seconds: float = 0.5,
        sqs: Any = None,
        on_failure_queue_url: str | None = None,
        s3: Any = None,
        on_failure_bucket: str | None = None,
    ) -> None:
        super().__init__(f"{function.name}:{spec.name}", function)
        self.spec = spec
        self._streams = streams
        self._region = region
        self._poll_interval = poll_interval
        self._retry_backoff = retry_backoff_seconds
        self._sqs = sqs
        self._on_failure_queue_url = on_failure_queue_url
        self._s3 = s3
        self._on_failure_bucket = on_failure_bucket
        self.mapping_id = str(uuid.uuid4())
        self._iterators: dict[str, str | None] = {}
        self._pending: collections.deque[_Pending] = collections.deque()
        self._injected: collections.deque[dict[str, Any]] = collections.deque()
        self._sequence = itertools.count(_INJECTED_BASE)
        self._lock = threading.Lock()
        self._attempts = 0
        self._limit = spec.batch_size

    def inject(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Queue Lambda-shaped stream records for delivery (sequence numbers filled in)."""
        with self._lock:
            for record in records:
                copy = json.loads(json.dumps(record))
                copy.setdefault("eventSourceARN", self.spec.stream_arn)
                copy["dynamodb"].setdefault("SequenceNumber", str(next(self._sequence)))
                self._injected.append(copy)

    def _work(self, index: int) -> None:
        while self._active():
            self._fetch()
            if not self._pending:
                self._sleep(self._poll_interval)
                continue
            oldest = self._pending[0].arrived
            if (
                len(self._pending) < self._limit
                and time.time() - oldest < self.spec.batching_window_seconds
            ):
                self._sleep(min(self._poll_interval, self.spec.batching_window_seconds))
                continue
            if not self._deliver(index):
                self._sleep(self._retry_backoff)

    def _fetch(self) -> None:
        if not self._iterators or all(v is None for v in self._iterators.values()):
            self._discover_shards()
        for shard_id, iterator in list(self._iterators.items()):
            if iterator is None:
                continue
            response = self._streams.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT)
            self._iterators[shard_id] = response.get("NextShardIterator")
            self._accept(
                _event_record(r, self._region, self.spec.stream_arn)
                for r in response.get("Records", [])
            )
        with self._lock:
            injected = list(self._injected)
            self._injected.clear()
        self._accept(injected)

    def _discover_shards(self) -> None:
        description = self._streams.describe_stream(StreamArn=self.spec.stream_arn)
        iterator_type = (
            "TRIM_HORIZON" if self.spec.starting_position == "TRIM_HORIZON" else "LATEST"
        )
        for shard in description["StreamDescription"].get("Shards", []):
            shard_id = shard["ShardId"]
            if shard_id in self._iterators:
                continue
            self._iterators[shard_id] = self._streams.get_shard_iterator(
                StreamArn=self.spec.stream_arn, ShardId=shard_id, ShardIteratorType=iterator_type
            )["ShardIterator"]

    def _accept(self, records: Iterable[dict[str, Any]]) -> None:
        now = time.time()
        for record in records:
            self.stats.add("read")
            if self.spec.filter is not None and not self.spec.filter.matches(record):
                self.stats.add("filtered")
                continue
            self._pending.append(_Pending(record, now))

    def _deliver(self, index: int) -> bool:
        """Invoke with the next batch; True when it is settled (done or given up)."""
        batch = list(itertools.islice(self._pending, self._limit))
        records = [p.record for p in batch]
        invocation = self._invoke(index, {"Records": records}, len(records))
        if self.spec.report_batch_item_failures:
            failed = failed_items(invocation, {r["dynamodb"]["SequenceNumber"] for r in records})
        else:
            failed = set() if invocation.ok else None
        if failed is not None:
            if not failed:
                self._settle(len(batch))
                return True
            done = next(
                i for i, r in enumerate(records) if r["dynamodb"]["SequenceNumber"] in failed
            )
            self.stats.add("item_failures", len(failed))
            self._settle(done)
            batch = batch[done:]
        elif self.spec.bisect_on_error and len(batch) > 1:
            self._limit = max(1, len(batch) // 2)
            self.stats.add("bisections")
            return False
        self._attempts += 1
        condition = self._exhausted(batch)
        if condition is None:
            return False
        self._send_to_destination(batch, invocation, condition)
        self._settle(len(batch))
        return True

    def _exhausted(self, batch: Sequence[_Pending]) -> str | None:
        retries = self.spec.maximum_retry_attempts
        if retries >= 0 and self._attempts > retries:
            return "RetryAttemptsExhausted"
        max_age = self.spec.maximum_record_age_seconds
        if max_age >= 0 and time.time() - batch[0].arrived > max_age:
            return "RecordAgeExceeded"
        return None

    def _settle(self, count: int) -> None:
        """Drop `count` delivered (or given-up) records; the next batch starts afresh."""
        if count == 0:
            return
        for _ in range(count):
            self._pending.popleft()
        self._attempts = 0
        self._limit = self.spec.batch_size

    def _send_to_destination(
        self, batch: Sequence[_Pending], invocation: Invocation, condition: str
    ) -> None:
        # Counted once the destination holds the batch: a reader that waits for the counter
        # finds what it counts.
        self._write_destination(batch, invocation, condition)
        self.stats.add("skipped_batches")
        self.stats.add("skipped_records", len(batch))

    def _write_destination(
        self, batch: Sequence[_Pending], invocation: Invocation, condition: str
    ) -> None:
        has_queue = bool(self._on_failure_queue_url) and self._sqs is not None
        has_bucket = bool(self._on_failure_bucket) and self._s3 is not None
        if not (has_queue or has_bucket):
            log.error(
                "%s: %d records skipped (%s), no on-failure destination",
                self.name,
                len(batch),
                condition,
            )
            return
        first, last = batch[0].record["dynamodb"], batch[-1].record["dynamodb"]
        error_type, message = invocation.describe_error()
        shard = next(iter(self._iterators), "")
        body: dict[str, Any] = {
            "version": "1.0",
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "requestContext": {
                "requestId": invocation.request_id,
                "functionArn": self.function.arn if self.function else "",
                "condition": condition,
                "approximateInvokeCount": self._attempts,
            },
            "responseContext": {
                "statusCode": 200,
                "executedVersion": "$LATEST",
                "functionError": "Unhandled" if error_type else "",
            },
            "DDBStreamBatchInfo": {
                "shardId": shard,
                "startSequenceNumber": first["SequenceNumber"],
                "endSequenceNumber": last["SequenceNumber"],
                "approximateArrivalOfFirstRecord": _iso(first.get("ApproximateCreationDateTime")),
                "approximateArrivalOfLastRecord": _iso(last.get("ApproximateCreationDateTime")),
                "batchSize": len(batch),
                "streamArn": self.spec.stream_arn,
            },
        }
        if message:
            body["responsePayload"] = {"errorType": error_type, "errorMessage": message}
        if has_bucket:
            body["payload"] = {"Records": [p.record for p in batch]}
            now = datetime.now(UTC)
            key = (
                f"aws/lambda/{self.mapping_id}/{shard or 'shard'}/{now:%Y/%m/%d}/"
                f"{now:%Y-%m-%dT%H.%M.%S}-{uuid.uuid4()}"
            )
            self._s3.put_object(Bucket=self._on_failure_bucket, Key=key, Body=json.dumps(body))
        else:
            self._sqs.send_message(
                QueueUrl=self._on_failure_queue_url, MessageBody=json.dumps(body)
            )


def _iso(epoch: Any) -> str:
    seconds = float(epoch) if epoch is not None else time.time()
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _event_record(record: Mapping[str, Any], region: str, stream_arn: str) -> dict[str, Any]:
    """A Streams API record (as boto3 parses it) in the shape Lambda delivers it."""
    dynamodb = dict(record["dynamodb"])
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        dynamodb["ApproximateCreationDateTime"] = int(created.timestamp())
    for image in ("Keys", "NewImage", "OldImage"):
        if image in dynamodb:
            dynamodb[image] = {k: event_value(v) for k, v in dynamodb[image].items()}
    converted: dict[str, Any] = {
        "eventID": record["eventID"],
        "eventName": record["eventName"],
        "eventVersion": record.get("eventVersion", "1.1"),
        "eventSource": "aws:dynamodb",
        "awsRegion": region,
        "dynamodb": dynamodb,
        "eventSourceARN": stream_arn,
    }
    if "userIdentity" in record:
        identity = record["userIdentity"]
        converted["userIdentity"] = {
            "type": identity["Type"],
            "principalId": identity["PrincipalId"],
        }
    return converted


def event_value(value: Mapping[str, Any]) -> dict[str, Any]:
    """A typed attribute value as Lambda's JSON carries it: binary as base64 text."""
    ((kind, inner),) = value.items()
    if kind == "B":
        return {"B": base64.b64encode(inner).decode()}
    if kind == "BS":
        return {"BS": [base64.b64encode(b).decode() for b in inner]}
    if kind == "M":
        return {"M": {k: event_value(v) for k, v in inner.items()}}
    if kind == "L":
        return {"L": [event_value(v) for v in inner]}
    return {kind: inner}
