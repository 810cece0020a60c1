"""The queue an operator command reads (a redrive's source, the reject listing): receive
(hidden for a while), delete, make visible again. Operator tooling, not in the layer: it
uses the layer's per-entry batch attempt (``delayq.queues.attempt_batch``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq import constants as c
from delayq.exceptions import DelayQueueError, QueueError
from delayq.queues import attempt_batch
from delayq.retry import AWS_ERRORS, Backoff, Deadline, retry_call, retry_partial

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["SourceMessage", "SourceQueue"]


@dataclass(frozen=True)
class SourceMessage:
    """One message read from a queue an operator command empties or lists."""

    message_id: str
    receipt_handle: str
    body: str


class SourceQueue:
    """A queue an operator command reads (a redrive's source, the reject listing): receive
    (hidden for a while), delete, make visible again.

    Per-entry failures of the batch calls are retried when SQS says they may succeed later
    and reported (never raised) otherwise: the message then simply stays on the queue.
    """

    def __init__(self, client: SQSClient, url: str, backoff: Backoff | None = None) -> None:
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
            retry, refused = attempt_batch(
                call,
                self.url,
                chunk,
                lambda m: {"ReceiptHandle": m.receipt_handle, **extra},
                f"{operation} ({self.url})",
            )
            problems.extend(
                f"{m.message_id}: {operation}: {f.get('Code')}: {f.get('Message')}"
                for m, f in refused
            )
            return retry

        for start in range(0, len(messages), c.SQS_BATCH_ENTRIES):
            chunk = list(enumerate(messages[start : start + c.SQS_BATCH_ENTRIES]))
            try:
                retry_partial(operation, attempt, chunk, self._backoff, deadline)
            except DelayQueueError as e:
                problems.extend(f"{m.message_id}: {operation}: {e}" for _, m in chunk)
        return problems
