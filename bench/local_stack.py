"""Measurements on the embedded local stack (moto server + librdkafka's mock cluster + the
event-source emulators, ``delayq_local``): a burst sharing one due-second, end-to-end lateness
at a steady rate, and the AWS requests the handlers make per message, counted with botocore
``before-call`` hooks on the handlers' own clients and on the event sources' clients.

Time is compressed as in ``delayq demo`` (horizon 60 s, look-ahead 50 s, tick 5 s), so both
paths (straight to SQS, and through DynamoDB and the scheduler) run within minutes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO, cast
from unittest import mock

from bench.handlers import environ

ROOT: Final = Path(__file__).resolve().parent.parent
TARGET: Final = "bench.orders"
# Small values: librdkafka's mock cluster keeps only ~5 MB per partition and drops the oldest
# records beyond that, so a 20,000-message burst of 1 KB records would lose its start before
# ingest reads it. Message size does not change the drain measured here.
VALUE: Final = b"v" * 100
# The highest rate at which the local stack kept its lateness flat on the reference machine
# (2 cores shared with other work): at 100/s the p99 reached 825 ms. The steady phase runs
# first, so that the burst's backlog cannot colour its lateness.
DEFAULT_STEADY_RATE: Final = 50.0


@dataclass(frozen=True)
class LocalOptions:
    """The measurements on the embedded local stack."""

    enabled: str = "auto"  # "auto": run when the stack starts; "yes": fail if it cannot; "no"
    # The default. It takes a few minutes only with the local runner's moto SQS patches
    # (delayq_local.moto_fixes): plain moto's receive slows down linearly with queue depth
    # (moto_depth_probe).
    burst_messages: int = 20_000
    steady_rate: float | None = None  # messages/s; None: DEFAULT_STEADY_RATE (50/s)
    steady_seconds: float = 60.0
    emitter_concurrency: int = 4


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


class CallCounter:
    """Counts API calls by who made them (a handler, or an event source's poller for a
    queue) and operation."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def _add(self, who: str, operation: str) -> None:
        with self._lock:
            self.calls[(who, operation)] += 1

    def handler_hook(self, function: str) -> Callable[..., None]:
        """A botocore ``before-call`` handler for a client of `function`'s handler (whichever
        thread calls: the scheduler queries its shards on a thread pool)."""

        def before_call(model: Any, **_: Any) -> None:
            operation = f"{model.service_model.service_name}.{model.name}"
            self._add(f"handler {function or 'other'}", operation)

        return before_call

    def event_source_hook(self) -> Callable[..., None]:
        """A ``before-parameter-build`` handler for the event sources' (shared) SQS client:
        counts by queue, and marks the call's context for :meth:`empty_receive_hook`."""

        def before_parameter_build(params: Any, model: Any, context: Any = None, **_: Any) -> None:
            queue = str(params.get("QueueUrl", "?")).rsplit("/", 1)[-1]
            who = f"event source ({queue.removeprefix('delayq-bench-')})"
            if context is not None:
                context["bench_who"] = who
            self._add(who, f"sqs.{model.name}")

        return before_parameter_build

    def empty_receive_hook(self) -> Callable[..., None]:
        """An ``after-call`` handler counting receives that returned nothing."""

        def after_call(parsed: Any = None, context: Any = None, **_: Any) -> None:
            if not (parsed or {}).get("Messages"):
                who = (context or {}).get("bench_who", "event source (?)")
                self._add(who, "sqs.ReceiveMessage(empty)")

        return after_call

    def snapshot(self) -> Counter[tuple[str, str]]:
        """A copy of the counts."""
        with self._lock:
            return Counter(self.calls)


@contextlib.contextmanager
def counted_handler_clients(counter: CallCounter) -> Iterator[None]:
    """Every boto3 client the handlers create (``delayq.runtime.client``) counts its calls,
    under the function whose invocation created it."""
    from delayq import runtime  # noqa: PLC0415
    from delayq_local.sandbox import current_function  # noqa: PLC0415

    # The patch wraps every service alike, so it sees the untyped implementation behind
    # runtime.client's per-service overloads.
    original = cast("Callable[[str, Any], Any]", runtime.client)

    def client(service: str, settings: Any) -> Any:
        made = original(service, settings)
        made.meta.events.register("before-call", counter.handler_hook(current_function()))
        return made

    # patch.object, not an assignment: the replacement is not typed as the overloads.
    with mock.patch.object(runtime, "client", client):
        yield


def _hook_event_sources(stack: Any, counter: CallCounter) -> None:
    from delayq_local.sources import SqsEventSource  # noqa: PLC0415

    sources = stack.sources.values()
    clients = {id(s.sqs): s.sqs for s in sources if isinstance(s, SqsEventSource)}
    for client in clients.values():
        client.meta.events.register("before-parameter-build.sqs", counter.event_source_hook())
        client.meta.events.register("after-call.sqs.ReceiveMessage", counter.empty_receive_hook())


@dataclass
class _Sent:
    ids: dict[str, int]  # delay id -> due ms
    started: float
    finished: float


def _send(
    producer: Any, count: int, due_of: Callable[[int], int], prefix: str, rate: float | None
) -> _Sent:
    from delayq_local.producer import Due  # noqa: PLC0415

    ids: dict[str, int] = {}
    started = time.time()
    for i in range(count):
        if rate:
            pause = started + i / rate - time.time()
            if pause > 0:
                time.sleep(pause)
        delay_id = f"{prefix}-{i}"
        due = due_of(i)
        ids[delay_id] = due
        key = f"{prefix}-{i:08d}".encode()  # distinct keys: spread over the partitions
        producer.send(TARGET, Due(at_ms=due), value=VALUE, key=key, delay_id=delay_id)
    producer.flush(120)
    return _Sent(ids, started, time.time())


# Longer than the delay queue's visibility timeout (180 s): a message whose delivery failed
# comes back after it, and is still delivered.
STALL_SECONDS: Final = 240.0


def wait_for(
    observer: Any, ids: dict[str, int], until: float, out: TextIO, stall_s: float = STALL_SECONDS
) -> list[Any]:
    """Wait until every id was delivered, ``until`` passes, or nothing new arrives for
    ``stall_s`` after the last due time."""
    last_due = max(ids.values()) / 1000
    last_count, last_change, last_print = -1, time.time(), 0.0
    while True:
        seen = [d for d in observer.deliveries() if d.delay_id in ids]
        count = len({d.delay_id for d in seen})
        now = time.time()
        if count != last_count:
            last_count, last_change = count, now
        if now - last_print >= 10:
            out.write(f"   {count}/{len(ids)} delivered\n")
            out.flush()
            last_print = now
        stalled = now - max(last_change, last_due) > stall_s
        if count >= len(ids) or now >= until or stalled:
            return seen
        time.sleep(0.5)


def first_per_id(deliveries: Sequence[Any]) -> list[Any]:
    """Each delay id's earliest delivery (a redelivered message counts once, at its first)."""
    first: dict[str, Any] = {}
    for d in deliveries:
        if d.delay_id not in first or d.emitted_ms < first[d.delay_id].emitted_ms:
            first[d.delay_id] = d
    return list(first.values())


def _burst(stack: Any, observer: Any, producer: Any, n: int, out: TextIO) -> dict[str, Any]:
    horizon = stack.config.time.horizon_seconds if stack.config.time else 900
    # Due beyond the horizon (the DynamoDB path), far enough out for ingest to store them all.
    due_second = int(time.time()) + horizon + 60 + n // 1000
    sent = _send(producer, n, lambda i: due_second * 1000 + (i * 7) % 1000, "burst", None)
    out.write(
        f"   burst: {n} requests due in second {due_second} sent in "
        f"{sent.finished - sent.started:.1f} s; waiting\n"
    )
    seen = first_per_id(wait_for(observer, sent.ids, due_second + max(900, n / 5), out))
    due_ms = due_second * 1000
    emitted = sorted(d.emitted_ms for d in seen)
    received = sorted(d.received_ms for d in seen)
    complete = len(seen) == n
    drain_s = (emitted[-1] - due_ms) / 1000 if emitted else None
    result: dict[str, Any] = {
        "messages": n,
        "delivered": len(seen),
        "complete": complete,
        "drain_seconds": round(drain_s, 2) if drain_s is not None else None,
        "messages_per_second": round(len(seen) / drain_s) if drain_s and drain_s > 0 else None,
        "emitter_span_seconds": round((emitted[-1] - emitted[0]) / 1000, 2) if emitted else None,
        "last_received_after_due_s": round((received[-1] - due_ms) / 1000, 2) if received else None,
        "early": sum(1 for d in seen if d.emitted_ms < d.due_ms),
        "missing_ids": sorted(set(sent.ids) - {d.delay_id for d in seen})[:20],
        "value_bytes": len(VALUE),
        "path": "DynamoDB (due beyond the compressed horizon), scheduler, delay queue, emitter",
        "source": "measured on the embedded local stack (moto server, mock Kafka, emulated "
        "event sources), time compressed",
        "method": "N requests with delay-deliver-at in one due-second, written at once; "
        "drain_seconds = last delay-emitted-ms minus the start of the due-second",
    }
    return result


def _steady(
    stack: Any,
    observer: Any,
    producer: Any,
    counter: CallCounter,
    *,
    rate: float,
    seconds: float,
    out: TextIO,
) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = stack.config.time
    horizon = cfg.horizon_seconds if cfg else 900
    n = max(1, int(rate * seconds))
    start_ms = int(time.time() * 1000)
    n_short = round(n * 0.2)
    short_ids = set(range(0, n, 5))  # every fifth: the 20% short share

    def due_of(i: int) -> int:
        sent_at = start_ms + int(i / rate * 1000)
        if i in short_ids:
            return sent_at + 3_000 + (i * 7919) % ((horizon - 8) * 1000)
        return sent_at + (horizon + 10) * 1000 + (i * 7919) % 40_000

    before = counter.snapshot()
    sent = _send(producer, n, due_of, "steady", rate)
    last_due = max(sent.ids.values()) / 1000
    out.write(f"   steady: {n} requests at {rate:g}/s over {seconds:g} s; waiting\n")
    seen = first_per_id(wait_for(observer, sent.ids, last_due + 120, out))
    time.sleep(3)  # the last deletes and statistics writes
    calls = counter.snapshot()
    calls.subtract(before)
    e2e = [d.received_ms - d.due_ms for d in seen]
    emit = [d.emitted_ms - d.due_ms for d in seen]
    early = sum(1 for d in seen if d.emitted_ms < d.due_ms)
    by_due = sorted(seen, key=lambda d: d.due_ms)
    third = max(1, len(by_due) // 3)
    first_p99 = percentile([d.received_ms - d.due_ms for d in by_due[:third]], 99)
    last_p99 = percentile([d.received_ms - d.due_ms for d in by_due[-third:]], 99)
    sustained = (
        None
        if first_p99 is None or last_p99 is None
        else len(seen) == n and last_p99 <= max(2 * first_p99, first_p99 + 250)
    )
    p99 = percentile(e2e, 99)
    worst = max(e2e) if e2e else None
    lateness = {
        "p50": percentile(e2e, 50),
        "p99": p99,
        "max": float(worst) if worst is not None else None,
        "early": early,
        "early_received": sum(1 for d in seen if d.received_ms < d.due_ms),
        "met": None if p99 is None or worst is None else (p99 <= 500 and worst <= 1000),
        "early_met": early == 0,
        "emit": {
            "p50": percentile(emit, 50),
            "p99": percentile(emit, 99),
            "max": float(max(emit)) if emit else None,
        },
        "messages": n,
        "delivered": len(seen),
        "rate_per_second": rate,
        "seconds": seconds,
        "p99_first_third": first_p99,
        "p99_last_third": last_p99,
        "sustained": sustained,
        "short_share": n_short / n,
        "source": "measured on the embedded local stack (moto server, mock Kafka, emulated "
        "event sources), time compressed",
        "method": "end to end: the observer's receive time minus delay-due-ms (emit: "
        "delay-emitted-ms minus due); early: delay-emitted-ms < due; one clock",
    }
    per_message: dict[str, dict[str, float]] = {}
    for (who, op), count in sorted(calls.items()):
        if count > 0:
            per_message.setdefault(who, {})[op] = round(count / n, 4)
    handlers: Counter[str] = Counter()
    for who, ops in per_message.items():
        if who.startswith("handler "):
            handlers.update(ops)
    delay_source = per_message.get("event source (DelayQueue)", {})
    receives = delay_source.get("sqs.ReceiveMessage", 0.0)
    empty = delay_source.get("sqs.ReceiveMessage(empty)", 0.0)
    sqs_handlers = sum(v for k, v in handlers.items() if k.startswith("sqs."))
    requests = {
        "messages": n,
        "rate_per_second": rate,
        "per_message": per_message,
        "sqs_handlers": round(sqs_handlers, 4),
        "sqs_with_event_source_nonempty": round(
            sqs_handlers + (receives - empty) + delay_source.get("sqs.DeleteMessageBatch", 0.0),
            4,
        ),
        "dynamodb_write_calls": round(
            sum(v for k, v in handlers.items() if k.split(".")[1] in _WRITES), 4
        ),
        "dynamodb_read_calls": round(
            sum(v for k, v in handlers.items() if k.split(".")[1] in _READS), 4
        ),
        "empty_receives_per_message": empty,
        "all_handlers": {k: round(v, 4) for k, v in sorted(handlers.items())},
        "note": "botocore before-call hooks on the handlers' clients and the event sources' "
        "clients. The local SQS event source short-polls (moto), so its empty receives are an "
        "emulator artefact (AWS long-polls); at this low rate batches are small and the "
        "compressed scheduler queries 16 shards every second: per-message figures are higher "
        "than at 100 M/day (see the in-memory figures)",
    }
    return lateness, requests


_WRITES: Final = frozenset({"BatchWriteItem", "PutItem", "UpdateItem", "DeleteItem"})
_READS: Final = frozenset({"GetItem", "BatchGetItem", "Query"})


def moto_depth_probe(
    depths: Sequence[int] = (100, 1000, 3000), receives: int = 10
) -> dict[str, Any]:
    """How long moto (in-process, in this process) takes for one ReceiveMessage +
    DeleteMessageBatch of 10 at a given queue depth: how far the local burst can grow before it
    measures moto instead of the product. The local runner's SQS patches count only if they
    were applied in this process, which the stack does only with moto in-process (by default
    moto runs in a child process): the result says whether they were."""
    import boto3  # noqa: PLC0415
    from moto import mock_aws  # noqa: PLC0415

    ms: dict[str, float] = {}
    with (
        environ({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}),
        mock_aws(),
    ):
        sqs = boto3.client("sqs", region_name="us-east-1")
        for depth in depths:
            url = sqs.create_queue(QueueName=f"depth-{depth}")["QueueUrl"]
            for _ in range(depth // 10):
                sqs.send_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(j), "MessageBody": "x" * 200} for j in range(10)],
                )
            start = time.perf_counter()
            for _ in range(receives):
                got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
                sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(got)
                    ],
                )
            ms[str(depth)] = round((time.perf_counter() - start) / receives * 1000, 1)
    from delayq_local import moto_fixes  # noqa: PLC0415

    patched = f"delayq_local.moto_fixes applied: {moto_fixes.applied()}"
    return {
        "ms_per_receive_and_delete_by_depth": ms,
        "local_runner_moto_patches": patched,
        "method": "moto in-process (mock_aws), one ReceiveMessage of 10 + DeleteMessageBatch, "
        f"mean of {receives}, 200 B bodies",
    }


class _Overruns(logging.Handler):
    """Collects the local runtime's "ran N s, past its T s timeout" warnings: Lambda would
    have stopped those invocations (the local runtime only reports them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "past its" in text:
            self.seen.append(text)


def measure(options: LocalOptions, out: TextIO) -> dict[str, Any]:
    """Start the stack; run the burst, then the steady phase; return the figures."""
    from delayq_local.kafka_mock import CONSUMER_TUNING  # noqa: PLC0415
    from delayq_local.observe import DeliveryObserver  # noqa: PLC0415
    from delayq_local.producer import DelayProducer  # noqa: PLC0415
    from delayq_local.stack import EmbeddedStack, StackConfig, TimeCompression  # noqa: PLC0415

    counter = CallCounter()
    config = StackConfig(
        project_root=ROOT,
        stack_name="delayq-bench",
        topics=(TARGET,),
        parameters={"AllowedTargets": "bench.*"},
        environment={"LOG_LEVEL": "WARNING"},
        concurrency={"EmitterFunction": options.emitter_concurrency},
        # The demo's compression, but a TTL grace long enough that TTL never races the
        # scheduler (in AWS the grace is a day; compressed to 60 s, a burst second the
        # scheduler needs minutes for expires under it and the safety net re-drives it).
        time=TimeCompression(
            horizon_seconds=60, lookahead_seconds=50, tick_seconds=5, ttl_grace_seconds=900
        ),
    )
    overruns = _Overruns()
    logging.getLogger("delayq_local.sandbox").addHandler(overruns)
    log_path = ROOT / "results" / "bench-handlers.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (
        log_path.open("w") as handler_output,
        contextlib.redirect_stdout(handler_output),
        warnings.catch_warnings(),
        counted_handler_clients(counter),
        EmbeddedStack(config) as stack,
    ):
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        _hook_event_sources(stack, counter)
        tuning = CONSUMER_TUNING if stack.mock_kafka is not None else None
        observer = DeliveryObserver(stack.kafka_bootstrap, [TARGET], tuning).start()
        producer = DelayProducer(stack.kafka_bootstrap, topic=stack.delay_topic)
        try:
            if options.steady_rate:
                rate, why = options.steady_rate, "given on the command line"
            else:
                rate, why = (
                    DEFAULT_STEADY_RATE,
                    "default: the highest rate at which this stack kept lateness flat on the "
                    "reference machine (2 shared cores; at 100/s p99 reached 825 ms)",
                )
            lateness, requests = _steady(
                stack,
                observer,
                producer,
                counter,
                rate=rate,
                seconds=options.steady_seconds,
                out=out,
            )
            lateness["rate_chosen"] = why
            steady_overruns = len(overruns.seen)
            burst = _burst(stack, observer, producer, options.burst_messages, out)
        finally:
            observer.stop()
            producer.close()  # before the stack's brokers go: it would reconnect until freed
        stats = stack.stats()
    logging.getLogger("delayq_local.sandbox").removeHandler(overruns)
    burst["invocations_past_timeout"] = overruns.seen[steady_overruns:]
    lateness["invocations_past_timeout"] = overruns.seen[:steady_overruns]
    depth = moto_depth_probe()
    out.write(
        f"   moto receive+delete by queue depth: {depth['ms_per_receive_and_delete_by_depth']}\n"
    )
    return {
        "moto_queue_depth": depth,
        "burst": burst,
        "lateness": lateness,
        "requests": requests,
        "duration_seconds": round(time.monotonic() - started, 1),
        "emitter_concurrency": options.emitter_concurrency,
        "time_compression": {
            "horizon_seconds": config.time.horizon_seconds if config.time else None,
            "lookahead_seconds": config.time.lookahead_seconds if config.time else None,
            "tick_seconds": config.time.tick_seconds if config.time else None,
            "ttl_grace_seconds": config.time.ttl_grace_seconds if config.time else None,
        },
        "sources": stats,
    }
