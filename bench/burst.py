"""Bursts: N messages sharing one due-second.

Two parts:

* :func:`scheduler_probe` runs the real scheduler on the in-memory clients with simulated call
  latency and Lambda's timeout (the fake clock advances per call; an invocation that passes
  its timeout is stopped, as Lambda stops it), tick after tick, and reports what each tick
  sent and whether the watermark moved. It shows whether one due-second holding N messages
  can be scheduled at all.
* :func:`scale_out_model` derives, stage by stage, the time 10 M messages sharing one
  due-second need in AWS: writes into DynamoDB (partition limits), the scheduler, the SQS
  event source's scale-out (~1,250 concurrent, +300 a minute) and the emitter's measured
  per-invocation cost, and the drain time after due.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from bench.cost import Assumptions, cpu_wall_ms
from bench.harness import InMemoryPipeline
from bench.reference_mix import batched, delay_request
from bench.template import FunctionConfig
from delayq import buckets
from delayq.envelope import decode_body
from delayq.queues import DelayQueue, SqsQueue
from delayq.retry import Deadline
from delayq.scheduler import run_scheduler
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS, FakeClock, no_sleep_backoff
from testkit.services import message_store

# Documented AWS limits (the services' quotas pages).
DDB_PARTITION_WCU: Final = 1000
DDB_PARTITION_RCU: Final = 3000
ESM_SQS_MAX_CONCURRENCY: Final = 1250
ESM_SQS_SCALE_PER_MINUTE: Final = 300
ESM_SQS_START_CONCURRENCY: Final = 5


class LambdaTimeoutError(Exception):
    """The invocation ran past its timeout: Lambda stops it here."""


class LatencyClient:
    """Wraps a fake client: each listed call advances the fake clock by its latency and
    stops the invocation once the clock passes ``hard_stop_ms``."""

    def __init__(self, inner: Any, clock: FakeClock, latency_ms: Mapping[str, float]) -> None:
        self._inner = inner
        self._clock = clock
        self._latency = latency_ms
        self.hard_stop_ms: int | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        latency = self._latency.get(name)
        if latency is None:
            return attr

        def call(**kwargs: Any) -> Any:
            if self.hard_stop_ms is not None and self._clock.now_ms >= self.hard_stop_ms:
                raise LambdaTimeoutError(name)
            result = attr(**kwargs)
            self._clock.advance(round(latency))
            return result

        return call


@dataclass
class TickOutcome:
    """One scheduler invocation of the probe."""

    tick: int
    sent: int
    stopped_by_timeout: bool
    watermark_before: int | None
    watermark_after: int | None
    duration_s: float


@dataclass
class ProbeResult:
    """What ticks did with one crowded due-second."""

    messages: int
    send_latency_ms: float
    timeout_s: int
    ticks: list[TickOutcome] = field(default_factory=list)
    completed: bool = False
    sent_total: int = 0

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        out = asdict(self)
        unique = self.messages if self.completed else max((t.sent for t in self.ticks), default=0)
        out["duplicates_sent"] = max(0, self.sent_total - unique)
        return out


def _remaining(clock: FakeClock, end_ms: int) -> Callable[[], int]:
    def remaining() -> int:
        return end_ms - clock.now_ms

    return remaining


def _queued_messages(pipeline: InMemoryPipeline, url: str) -> int:
    """Delay messages in the queue (a bundle counts each of its messages)."""
    return sum(len(decode_body(m.body)) for m in pipeline.sqs.messages(url))


def scheduler_probe(
    messages: int,
    *,
    send_latency_ms: float = 10.0,
    query_latency_ms: float = 6.0,
    update_latency_ms: float = 5.0,
    timeout_s: int = 60,
    safety_ms: int = 10_000,
    ticks: int = 3,
    value_bytes: int = 100,
) -> ProbeResult:
    """Store ``messages`` in one due-second, then run scheduler ticks (60 s apart) with the
    handler's deadline (timeout minus ``safety_ms``) and Lambda's hard stop at the timeout."""
    pipeline = InMemoryPipeline.create()
    result = ProbeResult(messages, send_latency_ms, timeout_s)
    try:
        s = pipeline.settings
        second = buckets.due_second(NOW_MS) + s.lookahead_seconds + 5
        deadline = pipeline.deadline()
        requests = [
            delay_request(i, second * 1000 + i % 1000, b"v" * value_bytes) for i in range(messages)
        ]
        for chunk in batched(requests, 1000):
            pipeline.store.put_messages(chunk, NOW_MS, deadline)
        pipeline.store.create_watermark(second - 1, NOW_MS, deadline)
        clock = pipeline.clock
        sqs = LatencyClient(pipeline.sqs, clock, {"send_message_batch": send_latency_ms})
        ddb = LatencyClient(
            pipeline.dynamodb,
            clock,
            {"query": query_latency_ms, "update_item": update_latency_ms},
        )
        # The scheduler's adapters, built as the pipeline's over the latency clients.
        store = message_store(ddb, s, no_sleep_backoff(), pipeline.executor)
        delay_queue = DelayQueue(
            SqsQueue(as_sqs_client(sqs), s.delay_queue_url, no_sleep_backoff()), s.emit_lead_ms
        )
        clock.now_ms = (second - s.lookahead_seconds) * 1000
        for tick in range(ticks):
            start = clock.now_ms
            before = _queued_messages(pipeline, s.delay_queue_url)
            end = start + timeout_s * 1000
            sqs.hard_stop_ms = ddb.hard_stop_ms = end
            watermark_before = _watermark(pipeline, deadline)
            stopped = False
            try:
                run_scheduler(
                    settings=s,
                    store=store,
                    delay_queue=delay_queue,
                    clock=clock,
                    deadline=Deadline(_remaining(clock, end), safety_ms),
                )
            except LambdaTimeoutError:
                stopped = True
            sqs.hard_stop_ms = ddb.hard_stop_ms = None
            watermark_after = _watermark(pipeline, deadline)
            sent = _queued_messages(pipeline, s.delay_queue_url) - before
            result.ticks.append(
                TickOutcome(
                    tick,
                    sent,
                    stopped,
                    watermark_before,
                    watermark_after,
                    round((clock.now_ms - start) / 1000, 1),
                )
            )
            result.sent_total += sent
            if watermark_after is not None and watermark_after >= second:
                result.completed = True
                break
            clock.now_ms = start + 60_000
        return result
    finally:
        pipeline.close()


# --- the AWS scale-out model ----------------------------------------------------------------


@dataclass
class Stage:
    """One stage of the burst's path and the rate that bounds it."""

    name: str
    messages_per_second: float
    seconds: float
    bound_by: str


@dataclass
class BurstModel:
    """Stage by stage, for ``messages`` sharing one due-second."""

    messages: int
    shards: int
    delay_topic_partitions: int
    emitter_max_concurrency: int
    stages: list[Stage]
    drain_seconds_after_due: float
    drain_messages_per_second: float
    scheduler_runs: int
    scheduler_messages_per_run: int
    notes: list[str]
    inputs: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return asdict(self)


def emitter_drain_seconds(
    messages: int,
    *,
    per_invocation_ms: float,
    batch: int,
    max_concurrency: int,
    start_concurrency: int,
    read_cap_per_second: float,
) -> tuple[float, float]:
    """Seconds to drain ``messages`` overdue messages through the SQS event source as it
    scales out (+300 concurrent a minute up to ``max_concurrency``), capped by the cancel
    marker reads; returns (seconds, mean rate)."""
    left = float(messages)
    t = 0.0
    step = 0.5
    while left > 0:
        concurrency = min(max_concurrency, start_concurrency + ESM_SQS_SCALE_PER_MINUTE * t / 60)
        rate = min(concurrency * batch / (per_invocation_ms / 1000), read_cap_per_second)
        left -= rate * step
        t += step
    return t, messages / t


def scale_out_model(
    *,
    messages: int,
    shards: int,
    wru_per_item: int,
    item_bytes: int,
    ingest_cpu_ms_per_batch: float,
    emitter_cpu_ms_per_message: float,
    emitter_batch: float,
    scheduler_cpu_ms_per_message: float,
    functions: FunctionConfig,
    assumptions: Assumptions,
    lookahead_s: int,
    lead_ms: int,
    delay_topic_partitions: int = 64,
    send_workers: int = 8,
    page_items: int = 250,
    tick_s: int = 60,
    steady_emitter_concurrency: int | None = None,
    messages_per_send: float = 10.0,
) -> BurstModel:
    """Derive the 10 M burst in AWS from measured per-invocation costs and documented limits."""
    a = assumptions
    notes: list[str] = []
    # 1. Ingest writes the burst into one due-second: 'shards' partitions x 1,000 WCU.
    ingest_ms = cpu_wall_ms(ingest_cpu_ms_per_batch, functions.memory_mb["ingest"], a) + (
        4 * a.ms_dynamodb_batch_write + a.ms_dynamodb_get
    )
    ingest_rate = delay_topic_partitions * 100 / (ingest_ms / 1000)
    ddb_write_cap = shards * DDB_PARTITION_WCU / wru_per_item
    write_rate = min(ingest_rate, ddb_write_cap)
    stages = [
        Stage(
            "ingest -> DynamoDB",
            write_rate,
            messages / write_rate,
            "DynamoDB partitions "
            f"({shards} shards x {DDB_PARTITION_WCU} WCU / {wru_per_item} WRU per item)"
            if ddb_write_cap < ingest_rate
            else f"ingest concurrency ({delay_topic_partitions} partitions x 100 per "
            f"{ingest_ms:.0f} ms)",
        )
    ]
    notes.append(
        "an on-demand table serves up to double its previous peak at once; a cold table "
        "needs warm throughput set in advance for this write rate"
    )

    # 2. The scheduler: one invocation at a time (FIFO ticks), a crowded second read round by
    # round (a page of every shard), each round's bundles sent `send_workers` calls at a time,
    # then a checkpoint (one conditional write); the next tick resumes after the checkpoint.
    round_messages = shards * page_items
    calls = math.ceil(round_messages / messages_per_send)
    round_ms = (
        a.ms_dynamodb_query
        + math.ceil(calls / send_workers) * a.ms_sqs_send_batch
        + a.ms_dynamodb_update
        + cpu_wall_ms(
            scheduler_cpu_ms_per_message * round_messages, functions.memory_mb["scheduler"], a
        )
    )
    usable_s = functions.timeout_s["scheduler"] - 10
    duty = min(1.0, usable_s / tick_s)
    run_rate = round_messages / (round_ms / 1000)
    read_rate = shards * DDB_PARTITION_RCU * 8192 / item_bytes  # eventually consistent: 8 KB/RCU
    fixed_rate = min(run_rate * duty, read_rate)
    per_run = int(run_rate * usable_s)
    runs = math.ceil(messages / per_run)
    stages.append(
        Stage(
            "scheduler (checkpoints inside a second)",
            fixed_rate,
            messages / fixed_rate,
            f"{round_ms:.0f} ms per round of {round_messages:,} ({shards} shards x {page_items} "
            f"items): Query {a.ms_dynamodb_query:g} ms + {calls} SendMessageBatch "
            f"({messages_per_send:.0f} messages each, bundles, measured) {send_workers} at a "
            f"time x {a.ms_sqs_send_batch:g} ms + checkpoint {a.ms_dynamodb_update:g} ms; "
            f"runs {usable_s} s of every {tick_s} s tick: {per_run:,} messages per run"
            + (f"; capped by query reads ({read_rate:,.0f}/s)" if read_rate < run_rate else ""),
        )
    )
    sched_s = messages / fixed_rate
    late_from_scheduler = max(0.0, sched_s - lookahead_s)
    notes.append(
        f"the scheduler starts {lookahead_s} s before due and needs {sched_s:.0f} s "
        f"({runs} runs), so messages reach SQS "
        + ("before due" if late_from_scheduler == 0 else f"up to {late_from_scheduler:.0f} s late")
    )

    # 3. The emitter behind the SQS event source. Overdue messages are not held, and a full
    # batch does not wait for the batching window.
    batch = max(1, round(emitter_batch))
    receives = math.ceil(batch / 10)
    event_source_overhead_ms = receives * a.ms_sqs_receive + a.ms_lambda_invoke
    emit_ms = (
        cpu_wall_ms(emitter_cpu_ms_per_message * batch, functions.memory_mb["emitter"], a)
        + math.ceil(batch / 100) * a.ms_dynamodb_batch_get
        + a.ms_kafka_flush
        + event_source_overhead_ms
    )
    cancel_cap = shards * DDB_PARTITION_RCU / 0.5  # cancel#<shard>: 0.5 RCU per key
    start = steady_emitter_concurrency or functions.emitter_max_concurrency
    results = {}
    for cap in sorted(
        {
            functions.emitter_max_concurrency,
            functions.emitter_max_concurrency_limit,
            ESM_SQS_MAX_CONCURRENCY,
        }
    ):
        results[cap] = emitter_drain_seconds(
            messages,
            per_invocation_ms=emit_ms,
            batch=batch,
            max_concurrency=cap,
            start_concurrency=min(start, cap),
            read_cap_per_second=cancel_cap,
        )
    chosen = min(functions.emitter_max_concurrency_limit, ESM_SQS_MAX_CONCURRENCY)
    drain_s, drain_rate = results[chosen]
    stages.append(
        Stage(
            f"emitter, EmitterMaxConcurrency {chosen}",
            drain_rate,
            drain_s,
            f"{emit_ms:.0f} ms per invocation of {batch} (CPU + BatchGetItem + flush + "
            f"{event_source_overhead_ms:g} ms event source: {receives} receives + hand-over), "
            f"+{ESM_SQS_SCALE_PER_MINUTE}/min "
            f"scale-out from {min(start, chosen)}, cancel reads <= {cancel_cap:,.0f}/s",
        )
    )
    for cap, (seconds, rate) in results.items():
        if cap != chosen:
            notes.append(
                f"with EmitterMaxConcurrency {cap}: {seconds:,.0f} s ({rate:,.0f} messages/s)"
            )
    # Steady state at 100 M/day: the emitter holds each batch ~lead + 1 s.
    return BurstModel(
        messages=messages,
        shards=shards,
        delay_topic_partitions=delay_topic_partitions,
        emitter_max_concurrency=chosen,
        stages=stages,
        drain_seconds_after_due=round(late_from_scheduler + drain_s, 1),
        drain_messages_per_second=round(drain_rate),
        scheduler_runs=runs,
        scheduler_messages_per_run=per_run,
        notes=notes,
        inputs={
            "item_bytes": item_bytes,
            "wru_per_item": wru_per_item,
            "ingest_cpu_ms_per_batch": ingest_cpu_ms_per_batch,
            "emitter_cpu_ms_per_message": emitter_cpu_ms_per_message,
            "emitter_batch": batch,
            "scheduler_cpu_ms_per_message": scheduler_cpu_ms_per_message,
            "lead_ms": lead_ms,
            "latencies_ms": {k: v for k, v in asdict(a).items() if k.startswith("ms_")},
            "limits": {
                "dynamodb_partition_wcu": DDB_PARTITION_WCU,
                "dynamodb_partition_rcu": DDB_PARTITION_RCU,
                "sqs_event_source_max_concurrency": ESM_SQS_MAX_CONCURRENCY,
                "sqs_event_source_scale_per_minute": ESM_SQS_SCALE_PER_MINUTE,
            },
        },
    )


def steady_emitter_concurrency(per_second: float, hold_ms: float, batch: float) -> int:
    """Concurrent emitter invocations needed at a steady rate when each batch is held."""
    return math.ceil(per_second * (hold_ms / 1000) / batch)


def _watermark(pipeline: InMemoryPipeline, deadline: Deadline) -> int | None:
    """The watermark's second (None: none yet)."""
    mark = pipeline.store.read_watermark(deadline)
    return None if mark is None else mark.second
