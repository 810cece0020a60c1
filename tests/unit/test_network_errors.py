"""Network failures (botocore errors that are not ClientError) at every adapter edge.

A call that never got an answer (connection refused or reset, read timeout) is retried like
throttling and, when it lasts, becomes the adapter's own error: a ``DelayQueueError`` that the
layer handles, never a raw botocore exception that fails a whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from delayq.exceptions import DelayQueueError
from delayq.payloads import PayloadStore
from delayq.queues import DelayQueue, SqsQueue, TickQueue
from delayq.retry import Deadline
from delayq.store import MessageStore, Watermark
from delayq_local.source_queue import SourceMessage, SourceQueue
from testkit.aws import as_dynamodb_client, as_s3_client, as_sqs_client
from testkit.clock import NOW_MS, no_sleep_backoff
from tests.factories import delay_request


class Unreachable:
    """A boto3 client whose every operation fails at the network layer; counts attempts."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.attempts = 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(**_: Any) -> Any:
            self.attempts += 1
            raise self.error

        return call


ERRORS = [
    EndpointConnectionError(endpoint_url="https://aws.example"),
    ReadTimeoutError(endpoint_url="https://aws.example"),
]


def deadline() -> Deadline:
    return Deadline.after(60)


def store(client: Unreachable) -> MessageStore:
    return MessageStore(
        as_dynamodb_client(client),
        "t",
        shards=2,
        ttl_grace_seconds=60,
        max_delay_seconds=3600,
        backoff=no_sleep_backoff(3),
    )


CALLS: dict[str, Callable[[Unreachable], object]] = {
    "store.put_messages": lambda c: store(c).put_messages(
        [delay_request(due_ms=NOW_MS + 3_600_000)], NOW_MS, deadline()
    ),
    "store.query_pages": lambda c: store(c).query_pages([("1#0", None)], 10, NOW_MS, deadline()),
    "store.cancelled": lambda c: store(c).cancelled([delay_request()], NOW_MS, deadline()),
    "store.read_watermark": lambda c: store(c).read_watermark(deadline()),
    "store.write_watermark": lambda c: store(c).write_watermark(
        Watermark(5), Watermark(6), NOW_MS, deadline()
    ),
    "store.put_item": lambda c: store(c).put_item({"pk": {"S": "x"}}, deadline()),
    "sqs.send": lambda c: DelayQueue(SqsQueue(as_sqs_client(c), "q", no_sleep_backoff(3)), 0).send(
        [delay_request(due_ms=NOW_MS)], NOW_MS, deadline()
    ),
    "sqs.change_visibility": lambda c: SqsQueue(
        as_sqs_client(c), "q", no_sleep_backoff(3)
    ).change_visibility("h", 5, deadline()),
    "sqs.put_tick": lambda c: TickQueue(as_sqs_client(c), "q", no_sleep_backoff(3)).put_tick(
        1, 60, NOW_MS, deadline()
    ),
    "sqs.receive": lambda c: SourceQueue(as_sqs_client(c), "q", no_sleep_backoff(3)).receive(
        10, 30, 0, deadline()
    ),
    "s3.offload": lambda c: PayloadStore(as_s3_client(c), "b", no_sleep_backoff(3)).offload(
        delay_request(value=b"v"), deadline()
    ),
}


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_lasting_network_failure_is_retried_then_raised_as_the_adapters_error(
    name: str, error: Exception
) -> None:
    client = Unreachable(error)
    with pytest.raises(DelayQueueError):
        CALLS[name](client)
    assert client.attempts == 3  # every attempt of the back-off, then our error


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_source_queue_delete_that_cannot_reach_sqs_reports_the_messages(
    error: Exception,
) -> None:
    client = Unreachable(error)
    problems = SourceQueue(as_sqs_client(client), "q", no_sleep_backoff(3)).delete(
        [SourceMessage("m-1", "h-1", "{}")], deadline()
    )
    assert len(problems) == 1
    assert problems[0].startswith("m-1: delete from source")
