"""The events Lambda's event sources deliver, built for tests and benchmarks: Kafka records
and events (MSK or self-managed), and SQS records. Headers as the Kafka event source shows
them: one ``{name: [byte, ...]}`` mapping per header."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Final

from testkit.clock import NOW_MS

ACCOUNT: Final = "123456789012"
REGION: Final = "us-east-1"
MSK_CLUSTER_ARN: Final = (
    f"arn:aws:kafka:{REGION}:{ACCOUNT}:cluster/delayq/abcd1234-ab12-cd34-ef56-abcdef123456-1"
)

# The control headers kafka_record takes by keyword.
CONTROL_HEADERS: Final = {
    "target": "delay-target",
    "seconds": "delay-seconds",
    "ms": "delay-ms",
    "deliver_at": "delay-deliver-at",
    "id": "delay-id",
    "cancel": "delay-cancel",
    "tenant": "delay-tenant",
    "priority": "delay-priority",
    "reschedule": "delay-reschedule",
    "was_due": "delay-was-due",
}


def header(name: str, value: str | bytes) -> dict[str, list[int]]:
    """One header as the Kafka event source shows it: a byte array."""
    raw = value.encode() if isinstance(value, str) else value
    return {name: list(raw)}


def control_headers(**control: str | bytes) -> list[dict[str, list[int]]]:
    """Control headers by keyword (``target="orders.timeout"``, ``id=...``), in the order
    given, as :func:`kafka_record` builds them: for a control header whose name is a value."""
    return [header(CONTROL_HEADERS[k], v) for k, v in control.items()]


def kafka_record(
    *,
    offset: int = 0,
    partition: int = 0,
    topic: str = "delay-requests",
    timestamp: int = NOW_MS,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: Sequence[Mapping[str, Sequence[object] | None]] | None = None,
    **control: str | bytes,
) -> dict[str, Any]:
    """A Kafka event record; control headers by keyword, in the order given
    (``target="orders.timeout"``, ``seconds="30"``, ``deliver_at=...``, ``ms=...``,
    ``id=...``, ``cancel=...``, ``tenant=...``, ``priority=...``, ``reschedule=...``,
    ``was_due=...``), then ``headers`` (any JSON values, for hostile input). No ``key`` /
    ``value`` field when None."""
    all_headers: list[Any] = control_headers(**control)
    all_headers.extend(headers or ())
    record: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp": timestamp,
        "timestampType": "LOG_APPEND_TIME",
        "headers": all_headers,
    }
    if key is not None:
        record["key"] = base64.b64encode(key).decode()
    if value is not None:
        record["value"] = base64.b64encode(value).decode()
    return record


def kafka_event(*records: dict[str, Any], msk: bool = True) -> dict[str, Any]:
    """An MSK (or self-managed) event with the records grouped by topic-partition."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        grouped.setdefault(
            f"{r.get('topic', 'delay-requests')}-{r.get('partition', 0)}", []
        ).append(r)
    event: dict[str, Any] = {"records": grouped}
    if msk:
        event["eventSource"] = "aws:kafka"
        event["eventSourceArn"] = MSK_CLUSTER_ARN
        event["bootstrapServers"] = "b-1.delayq.abcd12.c2.kafka.us-east-1.amazonaws.com:9098"
    else:
        event["eventSource"] = "SelfManagedKafka"
        event["bootstrapServers"] = "broker-1.example.internal:9092"
    return event


def queue_arn(url: str) -> str:
    """The ARN of the queue at ``url`` (what an SQS event record names as its source)."""
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{url.rsplit('/', 1)[-1]}"


def sqs_record(
    *,
    message_id: str,
    receipt_handle: str,
    body: str,
    source_arn: str,
    receive_count: int = 1,
    sent_ms: int = NOW_MS,
    first_receive_ms: int | None = None,
) -> dict[str, Any]:
    """One record of an SQS event as the Lambda event source delivers it (first received when
    sent unless ``first_receive_ms`` says otherwise)."""
    return {
        "messageId": message_id,
        "receiptHandle": receipt_handle,
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": str(sent_ms),
            "SenderId": "AIDAEXAMPLE",
            "ApproximateFirstReceiveTimestamp": str(
                sent_ms if first_receive_ms is None else first_receive_ms
            ),
        },
        "messageAttributes": {},
        "md5OfBody": "0" * 32,
        "eventSource": "aws:sqs",
        "eventSourceARN": source_arn,
        "awsRegion": REGION,
    }
