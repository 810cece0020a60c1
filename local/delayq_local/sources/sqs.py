"""The SQS event source: Lambda's poller for a queue.

One poller receives up to `BatchSize` messages (gathering for `MaximumBatchingWindowInSeconds`
when the batch size is above 10) whenever one of the `concurrency` execution environments is
free, and hands the batch to it. The environment invokes the function with the SQS event, then
deletes: everything when the function succeeds; all but the reported items with
`ReportBatchItemFailures`; nothing when it raises, times out, or answers with a response Lambda
rejects. Undeleted messages reappear after the visibility timeout, and SQS itself moves them to
the dead-letter queue after `maxReceiveCount` receives (moto does this on receive).

Latency: with `wait_seconds > 0` the poller long-polls, which returns at once for new messages,
but moto notices a delayed message becoming visible only once a second. `wait_seconds=0`
short-polls every `idle_sleep` seconds instead, which bounds the receive latency after a
`DelaySeconds` expiry by that interval (at the cost of a request per interval).
"""

from __future__ import annotations

import base64
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from delayq_local.filters import sqs_view
from delayq_local.sandbox import Invocation, LocalFunction
from delayq_local.sources.base import EventSource, failed_items
from delayq_local.specs import SqsEventSpec

log = logging.getLogger(__name__)

SQS_RECEIVE_MAX: Final = 10


class SqsEventSource(EventSource):
    """Polls one queue for one function."""

    def __init__(
        self,
        function: LocalFunction,
        spec: SqsEventSpec,
        sqs: Any,
        queue_url: str,
        *,
        region: str,
        concurrency: int = 1,
        wait_seconds: int = 0,
        idle_sleep: float = 0.05,
        visibility_timeout: int | None = None,
    ) -> None:
        # Threads 0..concurrency-1 invoke (one environment each); the last one polls.
        super().__init__(
            f"{function.name}:{spec.name}",
            function,
            environments=concurrency,
            threads=concurrency + 1,
        )
        self.spec = spec
        self.queue_url = queue_url
        self._sqs = sqs
        self._region = region
        self._wait_seconds = wait_seconds
        self._idle_sleep = idle_sleep
        self._visibility_timeout = visibility_timeout
        self.concurrency = concurrency
        self._idle = threading.Semaphore(concurrency)
        self._batches: queue.Queue[list[dict[str, Any]]] = queue.Queue()

    @property
    def sqs(self) -> Any:
        """The SQS client this source receives and deletes with (callers may hook its events)."""
        return self._sqs

    def _work(self, index: int) -> None:
        if index == self.concurrency:
            self._poll()
            return
        while self._active():
            try:
                records = self._batches.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                invocation = self._invoke(index, {"Records": records}, len(records))
                self._delete(self._settled(invocation, records))
            finally:
                self._idle.release()

    def _poll(self) -> None:
        while self._active():
            if not self._idle.acquire(timeout=0.2):
                continue
            handed = False
            try:
                records = self._next_batch()
                if records:
                    self._batches.put(records)
                    handed = True
            finally:
                if not handed:
                    self._idle.release()
            if not handed and self._wait_seconds == 0:
                self._sleep(self._idle_sleep)

    def _next_batch(self) -> list[dict[str, Any]]:
        records = [self._record(m) for m in self._receive_batch()]
        if self.spec.filter is None or not records:
            return records
        dropped = [r for r in records if not self.spec.filter.matches(sqs_view(r))]
        # Lambda deletes the messages that its filter drops.
        self._delete(dropped)
        self.stats.add("filtered", len(dropped))
        return [r for r in records if r not in dropped]

    def _settled(
        self, invocation: Invocation, records: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        if not self.spec.report_batch_item_failures:
            return list(records) if invocation.ok else []
        failed = failed_items(invocation, {r["messageId"] for r in records})
        if failed is None:
            return []
        self.stats.add("item_failures", len(failed))
        return [r for r in records if r["messageId"] not in failed]

    def _receive_batch(self) -> list[dict[str, Any]]:
        messages = self._receive(min(SQS_RECEIVE_MAX, self.spec.batch_size), self._wait_seconds)
        window_ends = time.monotonic() + self.spec.batching_window_seconds
        while (
            messages
            and len(messages) < self.spec.batch_size
            and time.monotonic() < window_ends
            and not self._stop.is_set()
        ):
            wanted = min(SQS_RECEIVE_MAX, self.spec.batch_size - len(messages))
            more = self._receive(wanted, 0)
            if not more:
                self._sleep(self._idle_sleep)
            messages.extend(more)
        return messages

    def _receive(self, count: int, wait_seconds: int) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": count,
            "WaitTimeSeconds": wait_seconds,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        if self._visibility_timeout is not None:
            kwargs["VisibilityTimeout"] = self._visibility_timeout
        messages: list[dict[str, Any]] = self._sqs.receive_message(**kwargs).get("Messages", [])
        self.stats.add("received", len(messages))
        return messages

    def _record(self, message: Mapping[str, Any]) -> dict[str, Any]:
        record: dict[str, Any] = {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": dict(message.get("Attributes", {})),
            "messageAttributes": {
                name: _message_attribute(value)
                for name, value in message.get("MessageAttributes", {}).items()
            },
            "md5OfBody": message.get("MD5OfBody", ""),
            "eventSource": "aws:sqs",
            "eventSourceARN": self.spec.queue_arn,
            "awsRegion": self._region,
        }
        if "MD5OfMessageAttributes" in message:
            record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
        return record

    def _delete(self, records: Sequence[Mapping[str, Any]]) -> None:
        for start in range(0, len(records), SQS_RECEIVE_MAX):
            chunk = records[start : start + SQS_RECEIVE_MAX]
            response = self._sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": r["receiptHandle"]} for i, r in enumerate(chunk)
                ],
            )
            failed = response.get("Failed", [])
            for entry in failed:
                log.warning("%s: delete failed: %s", self.name, entry)
            self.stats.add("deleted", len(chunk) - len(failed))
            self.stats.add("delete_failures", len(failed))


def _message_attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    attribute: dict[str, Any] = {
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": value["DataType"],
    }
    if "StringValue" in value:
        attribute["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        attribute["binaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
    return attribute
