"""The floor of each handler's work: the least any implementation must do on the same inputs.

Per-core rates vary threefold between shared machines; the ratio of a handler's CPU per
message to the CPU per message of its floor, measured in the same run on the same events,
does not (much). ``bench.cpu`` times the floors exactly like the handlers, interleaved
with them.

- **ingest floor**: decode the Lambda Kafka events (base64 key and value of every record,
  header values from lists of signed byte ints to bytes) and serialise, with ``json.dumps``,
  the DynamoDB ``BatchWriteItem`` and SQS ``SendMessageBatch`` parameters the handler sent for
  the same events (captured from the in-memory fakes in an untimed run): botocore must
  serialise them to send them. The event is a dict in both measurements (no ``json.loads``
  of the event text in either).
- **emitter floor**: ``json.loads`` of every SQS body (a single envelope or a bundle), base64
  of the key, value and header values inside, the delivery headers of the record (id, due,
  emitted, attempt), one real ``confluent_kafka.Producer.produce()`` per record and one
  ``flush()`` per SQS batch, like the handler's.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from delayq import constants as c

# librdkafka's mock cluster (in-process brokers): produce() and flush() do the real client
# work (batching, the idempotent producer's sequence numbers, the wire protocol, delivery
# reports) with no network. The buffers are large so that produce() never waits.
MOCK_PRODUCER_CONFIG: Final[dict[str, Any]] = {
    "test.mock.num.brokers": 1,
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 2,
    "queue.buffering.max.messages": 10_000_000,
    "queue.buffering.max.kbytes": 8_000_000,
    "log_level": 3,  # the mock cluster announces itself at level 5
}


def mock_producer() -> Any:
    """A ``confluent_kafka.Producer`` on librdkafka's mock cluster."""
    from confluent_kafka import Producer  # noqa: PLC0415 -- optional dependency

    return Producer(dict(MOCK_PRODUCER_CONFIG))


@dataclass
class CapturedRequest:
    """One API call's parameters, as the adapter passed them to the client."""

    operation: str
    params: dict[str, Any]


def capture_calls(client: Any, methods: Sequence[str], into: list[CapturedRequest]) -> None:
    """Record every call of ``methods`` on ``client`` (an in-memory fake) into ``into``; the
    call itself goes on as before."""
    for name in methods:
        original = getattr(client, name)

        def wrapper(*args: Any, __name: str = name, __f: Any = original, **kwargs: Any) -> Any:
            into.append(CapturedRequest(__name, dict(kwargs)))
            return __f(*args, **kwargs)

        setattr(client, name, wrapper)


INGEST_WRITES: Final = (("dynamodb", "batch_write_item"), ("sqs", "send_message_batch"))


def _blob(value: Any) -> str:
    """What botocore's JSON serialiser does with a blob (a DynamoDB ``B``): base64."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _header_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    try:
        return bytes(value)
    except ValueError:  # signed bytes (Java's byte): -128..-1
        return bytes(b & 0xFF for b in value)


def ingest_floor(events: Iterable[Any], requests: Sequence[CapturedRequest]) -> int:
    """Decode every record of the events and serialise the requests; returns the records
    decoded."""
    b64 = base64.b64decode
    n = 0
    for event in events:
        for records in event["records"].values():
            for record in records:
                key, value = record.get("key"), record.get("value")
                if key is not None:
                    b64(key)
                if value is not None:
                    b64(value)
                for header in record.get("headers") or ():
                    for raw in header.values():
                        _header_bytes(raw)
                n += 1
    dumps = json.dumps
    for request in requests:
        dumps(request.params, default=_blob)
    return n


def _dec(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _envelopes(body: str) -> list[Any]:
    d = json.loads(body)
    if d.get("v") == 2:
        return list(d["messages"])
    return [d]


def emitter_floor(
    events: Iterable[Any],
    producer: Any,
    clock: Callable[[], int],
    on_delivery: Callable[[Any, Any], None] | None = None,
) -> int:
    """Decode every SQS body of the events and produce each message it holds, with its
    delivery headers, one ``flush()`` per event; returns the records produced."""
    n = 0
    for event in events:
        for record in event["Records"]:
            receive_count = int(record["attributes"]["ApproximateReceiveCount"])
            for d in _envelopes(record["body"]):
                now = clock()
                headers: list[tuple[str, bytes | None]] = [
                    (name, _dec(v)) for name, v in d["headers"]
                ]
                headers += [
                    (c.HEADER_ID, d["id"].encode()),
                    (c.HEADER_DUE_MS, str(d["due_ms"]).encode()),
                    (c.HEADER_EMITTED_MS, str(now).encode()),
                    (c.HEADER_ATTEMPT, str(d.get("n", 0) + receive_count).encode()),
                ]
                producer.produce(
                    d["target"],
                    value=_dec(d["value"]),
                    key=_dec(d["key"]),
                    headers=headers,
                    on_delivery=on_delivery,
                )
                n += 1
        producer.flush(30)
    return n


def ratio(handler_cpu_s: float, floor_cpu_s: float) -> float | None:
    """Handler CPU over floor CPU for the same messages (None when the floor took no time)."""
    if floor_cpu_s <= 0:
        return None
    return handler_cpu_s / floor_cpu_s
