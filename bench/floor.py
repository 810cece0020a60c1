"""The floor of each handler's work: the least any implementation must do on the same inputs.

Per-core rates vary threefold between shared machines; the ratio of a handler's CPU per
message to the CPU per message of its floor, measured in the same run on the same events,
does not (much). ``bench.cpu`` times the floors exactly like the handlers, interleaved
with them.

- **ingest floor**: decode the Lambda Kafka events (base64 key and value of every record,
  header values from lists of signed byte ints to bytes), deflate the keys and values that
  the handler stored deflated (``zlib.compress`` at the store's level: those bytes are in the
  request, and nothing writes them without deflating), and serialise, with ``json.dumps``,
  the DynamoDB ``BatchWriteItem`` and SQS ``SendMessageBatch`` parameters the handler sent for
  the same events (captured from the in-memory fakes in an untimed run): botocore must
  serialise them to send them. The event is a dict in both measurements (no ``json.loads``
  of the event text in either). The handler is measured on clients that serialise every
  request the same way and answer what the in-memory fakes answered in the capturing run
  (:func:`replay_calls`), so that both sides pay the same for the wire and neither for an
  emulator's bookkeeping.
- **emitter floor**: ``json.loads`` of every SQS body (a single envelope or a bundle), base64
  of the key, value and header values inside, the delivery headers of the record (id, due,
  emitted, attempt), one real ``confluent_kafka.Producer.produce()`` per record and one
  ``flush()`` per SQS batch, like the handler's.
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
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
    """One API call's parameters, as the adapter passed them to the client, and what the
    client answered (or raised)."""

    operation: str
    params: dict[str, Any]
    response: Any = None
    error: Exception | None = None


def capture_calls(client: Any, methods: Sequence[str], into: list[CapturedRequest]) -> None:
    """Record every call of ``methods`` on ``client`` (an in-memory fake) into ``into``, with
    its answer or error; the call itself goes on as before."""
    for name in methods:
        original = getattr(client, name)

        def wrapper(*args: Any, __name: str = name, __f: Any = original, **kwargs: Any) -> Any:
            captured = CapturedRequest(__name, dict(kwargs))
            into.append(captured)
            try:
                captured.response = __f(*args, **kwargs)
            except Exception as e:
                captured.error = e
                raise
            return captured.response

        setattr(client, name, wrapper)


def retried_calls(requests: Sequence[CapturedRequest]) -> list[str]:
    """The calls of ``requests`` that failed or left work to send again (an error,
    ``UnprocessedItems``, ``Failed`` entries): in a run that had any, the same write appears
    twice, and a floor built from it would deflate and serialise it twice."""
    out = []
    for r in requests:
        answer = r.response if isinstance(r.response, dict) else {}
        if r.error is not None or any(answer.get("UnprocessedItems", {}).values()):
            out.append(f"{r.operation}: {r.error or 'UnprocessedItems'}")
        elif answer.get("Failed"):
            out.append(f"{r.operation}: Failed {answer['Failed']}")
    return out


# What ingest may call, by client; the floor serialises the writes only (the pending counts'
# updates and the watermark's reads are the handler's own bookkeeping).
INGEST_CALLS: Final = {
    "dynamodb": ("batch_write_item", "update_item", "get_item", "put_item", "query"),
    "sqs": ("send_message_batch", "send_message"),
}
INGEST_WRITES: Final = frozenset({"batch_write_item", "send_message_batch"})


class _Replay:
    """One operation of a replaying client: serialises the parameters as botocore's JSON
    protocols do and answers (or raises) what the capturing run did, in the order calls
    arrive. Calls from threads (the SQS sends) may get one another's answers; ingest reads
    only their ``Failed`` lists, empty in every answer of a clean capture."""

    def __init__(self, operation: str, captured: Sequence[CapturedRequest]) -> None:
        self.operation = operation
        self._left = deque(captured)
        self._lock = threading.Lock()

    def __call__(self, **params: Any) -> Any:
        json.dumps(params, default=_blob)
        with self._lock:
            if not self._left:
                raise AssertionError(f"{self.operation} called more often than when captured")
            answer = self._left.popleft()
        if answer.error is not None:
            raise answer.error
        return answer.response

    @property
    def unanswered(self) -> int:
        """Captured calls the replaying run has not made (yet)."""
        return len(self._left)


@dataclass
class Replaying:
    """The replaying operations installed on a run's clients."""

    operations: list[_Replay] = field(default_factory=list)

    def check_done(self) -> None:
        """Fail unless the run made every captured call (outside the timed region: a run
        that made fewer calls than captured was not the run captured)."""
        short = {o.operation: o.unanswered for o in self.operations if o.unanswered}
        if short:
            raise AssertionError(f"calls captured but not made by the run: {short}")


def replay_calls(
    client: Any,
    methods: Sequence[str],
    captured: Sequence[CapturedRequest],
    into: Replaying,
) -> None:
    """Make ``methods`` of ``client`` serialise their parameters (``json.dumps``, blobs as
    base64, as the floor does) and answer from ``captured`` instead of doing the work, each
    captured call once; a method the capturing run did not call fails loudly (the
    measurement would not be the one captured). The operations are added to ``into``."""
    for name in methods:
        calls = [r for r in captured if r.operation == name]
        if calls:
            replay = _Replay(name, calls)
            into.operations.append(replay)
            setattr(client, name, replay)
        else:
            setattr(client, name, _not_captured(name))


def _not_captured(name: str) -> Callable[..., Any]:
    def call(**_params: Any) -> Any:
        raise AssertionError(f"{name} was not called when the requests were captured")

    return call


def deflated_blobs(requests: Sequence[CapturedRequest]) -> list[bytes]:
    """The plain bytes of every key and value the handler stored deflated in ``requests``
    (``BatchWriteItem`` items' ``key_z`` / ``value_z``, ``PutItem``'s item): what a floor
    must deflate to write the same requests."""
    items: list[Any] = []
    for request in requests:
        if request.operation == "batch_write_item":
            for puts in request.params["RequestItems"].values():
                items += [p["PutRequest"]["Item"] for p in puts if "PutRequest" in p]
        elif request.operation == "put_item":
            items.append(request.params["Item"])
    return [
        zlib.decompress(item[name]["B"])
        for item in items
        for name in (c.ATTR_KEY_Z, c.ATTR_VALUE_Z)
        if name in item
    ]


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


def ingest_floor(
    events: Iterable[Any], requests: Sequence[CapturedRequest], deflate: Sequence[bytes] = ()
) -> int:
    """Decode every record of the events, deflate ``deflate`` at the store's level and
    serialise the write requests; returns the records decoded."""
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
    compress, level = zlib.compress, c.STORE_ZLIB_LEVEL
    for raw in deflate:
        compress(raw, level)
    dumps = json.dumps
    for request in requests:
        if request.operation in INGEST_WRITES:
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
