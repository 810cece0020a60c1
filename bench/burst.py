"""Bursts: N messages sharing one due-second.

Two parts:

* :func:`scheduler_probe` runs the real scheduler on the in-memory clients with simulated call
  latency and Lambda's timeout (the fake clock advances per call; an invocation that passes
  its timeout is stopped, as Lambda stops it), tick after tick, and reports what each tick
  sent and whether the watermark moved. It shows whether one due-second holding N messages
  can be scheduled at all.
* :func:`scale_out_model` runs 10 M messages sharing one due-second through the AWS-scale
  model (:mod:`sim.scale`, on the simulator's clock): writes into DynamoDB (partition limits,
  warm throughput), the scheduler's rounds at their measured cost, the SQS event source's
  scale-out and the emitter's measured CPU, and reports the drain time after due and what
  bound each stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from bench.cost import Assumptions
from bench.harness import InMemoryPipeline
from bench.reference_mix import batched, delay_request
from bench.template import FunctionConfig
from delayq import buckets
from delayq.envelope import decode_body
from delayq.queues import DelayQueue, SqsQueue
from delayq.retry import Deadline
from delayq.scheduler import run_scheduler
from delayq.settings import Settings
from sim.scale import (
    BURST,
    DDB_NEW_ON_DEMAND_TABLE_WRU,
    DDB_PARTITION_RCU,
    DDB_PARTITION_WCU,
    KAFKA_INVOCATIONS_PER_PARTITION,
    LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY,
    LAMBDA_FULL_VCPU_MB,
    SQS_POLLER_BYTES_PER_SECOND,
    SQS_POLLER_INVOCATIONS,
    SQS_PROVISIONED_MAX_CONCURRENCY,
    SQS_PROVISIONED_MIN_POLLERS_MAX,
    SQS_PROVISIONED_SCALE_PER_MINUTE,
    SQS_STANDARD_MAX_CONCURRENCY,
    SQS_STANDARD_SCALE_PER_MINUTE,
    SQS_STANDARD_START_CONCURRENCY,
    Costs,
    Deployment,
    EventSource,
    ScaleRun,
    Traffic,
    simulate,
)
from testkit.aws import as_sqs_client
from testkit.clock import NOW_MS, FakeClock, no_sleep_backoff
from testkit.services import message_store


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

SOURCE: Final = (
    "simulated at AWS scale (sim.scale, cohorts on the simulator's clock) from documented "
    "limits and measured costs; not measured in AWS"
)


def scale_costs(
    *,
    ingest_cpu_ms_per_batch: float,
    scheduler_cpu_ms_per_message: float,
    emitter_cpu_ms_per_message: float,
    assumptions: Assumptions,
) -> Costs:
    """The scale model's costs: this run's measured CPU and the cost model's call latencies
    (one set of assumptions for the cost, burst and fairness figures)."""
    a = assumptions
    return Costs(
        ingest_cpu_ms_per_batch=ingest_cpu_ms_per_batch,
        scheduler_cpu_ms_per_message=scheduler_cpu_ms_per_message,
        emitter_cpu_ms_per_message=emitter_cpu_ms_per_message,
        ms_dynamodb_batch_write=a.ms_dynamodb_batch_write,
        ms_dynamodb_get=a.ms_dynamodb_get,
        ms_dynamodb_batch_get=a.ms_dynamodb_batch_get,
        ms_dynamodb_query=a.ms_dynamodb_query,
        ms_dynamodb_update=a.ms_dynamodb_update,
        ms_sqs_send_batch=a.ms_sqs_send_batch,
        ms_sqs_receive=a.ms_sqs_receive,
        ms_lambda_invoke=a.ms_lambda_invoke,
        ms_kafka_flush=a.ms_kafka_flush,
        arm_speed_vs_bench_core=a.arm_speed_vs_bench_core,
    )


def scale_deployment(
    settings: Settings, functions: FunctionConfig, *, steady_emitter_concurrency: int
) -> Deployment:
    """The deployment the AWS-scale figures start from: the layer's settings, the template's
    memory and event sources (standard mode), EmitterMaxConcurrency at its maximum (what the
    README recommends for bursts), the account's default concurrency and a table whose warm
    throughput is a new on-demand table's."""
    normal = min(functions.emitter_max_concurrency_limit, SQS_STANDARD_MAX_CONCURRENCY)
    source = {
        "batch_size": functions.emitter_batch_size,
        "window_ms": round(functions.emitter_batching_window_s * 1000),
    }
    sources = {
        "normal": EventSource(
            max_concurrency=normal,
            start_concurrency=min(normal, steady_emitter_concurrency),
            **source,
        ),
        **{
            name: EventSource(max_concurrency=cap, **source)
            for name, cap in functions.emitter_priority_max_concurrency.items()
        },
    }
    return Deployment(
        shards=settings.shards,
        page_items=settings.scheduler_page_items,
        lookahead_s=settings.lookahead_seconds,
        tick_s=settings.tick_seconds,
        emit_lead_ms=settings.emit_lead_ms,
        bundle_max_messages=settings.bundle_max_messages,
        bundle_max_bytes=settings.bundle_max_bytes,
        memory_mb=dict(functions.memory_mb),
        scheduler_timeout_s=functions.timeout_s["scheduler"],
        sources=sources,
    )


@dataclass
class Stage:
    """One stage of the burst's path: when it ran (seconds from due) and what bound it."""

    name: str
    messages_per_second: float
    seconds: float
    bound_by: str
    started_s: float | None = None
    finished_s: float | None = None


@dataclass
class BurstModel:
    """The burst through the scale model, stage by stage."""

    messages: int
    shards: int
    delay_topic_partitions: int
    emitter_max_concurrency: int
    stages: list[Stage]
    drain_seconds_after_due: float | None
    drain_messages_per_second: float
    lateness_after_due_ms: dict[str, float | None]
    scheduler_runs: int
    scheduler_messages_per_run: int
    notes: list[str]
    inputs: dict[str, Any]
    source: str = SOURCE

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return asdict(self)


def _stages(run: ScaleRun) -> list[Stage]:
    out = []
    for s in run.stages:
        seconds = 0.0 if s.started_s is None or s.finished_s is None else s.finished_s - s.started_s
        out.append(
            Stage(
                s.name, round(s.messages_per_second), seconds, s.bound_by, s.started_s, s.finished_s
            )
        )
    return out


def scale_out_model(
    *,
    messages: int,
    deployment: Deployment,
    costs: Costs,
    item_bytes: int,
    wru_per_item: int,
    value_bytes: int = 1024,
    seed: int = 0,
) -> BurstModel:
    """``messages`` of 1 KB written at once, due in the same second an hour later, through the
    scale model (:mod:`sim.scale`): ingest, DynamoDB, the scheduler, the delay queue's event
    source scaling out and the emitter, each bound by its documented limit and measured cost.
    """
    traffic = Traffic(messages, value_bytes, item_bytes=item_bytes, wru_per_item=wru_per_item)
    run = simulate(deployment, costs, traffic, seed=seed)
    normal = deployment.sources["normal"]
    drain = run.drain_seconds_after_due
    ingest, scheduler, _ = run.stages
    notes = [
        f"the burst is written {traffic.written_before_due_s} s before due; ingest stores it "
        f"from {ingest.started_s:,.0f} s to {ingest.finished_s:,.0f} s (bound by "
        f"{ingest.bound_by})",
        f"the scheduler starts at {scheduler.started_s:,.0f} s (look-ahead "
        f"{deployment.lookahead_s} s, the minute's tick drawn by the seed) and sends the last "
        f"of the burst at {scheduler.finished_s:,.0f} s ({run.scheduler_runs} runs, "
        f"{run.scheduler_rounds:,} rounds; bound by {scheduler.bound_by})",
        f"the delay queue's event source ({run.sources['normal'].mode} mode) peaked at "
        f"{run.sources['normal'].peak_concurrency:,} concurrent emitters of "
        f"{run.sources['normal'].ceiling:,}",
    ]
    for cap in sorted({100, normal.max_concurrency} - {normal.max_concurrency}):
        other = replace(
            deployment,
            sources={**deployment.sources, "normal": replace(normal, max_concurrency=cap)},
        )
        alt = simulate(other, costs, traffic, seed=seed)
        notes.append(
            f"with EmitterMaxConcurrency {cap}: drained {alt.drain_seconds_after_due:,.0f} s "
            "after due"
        )
    scheduler_memory = deployment.memory_mb["scheduler"]
    if scheduler.bound_by.startswith("its CPU") and scheduler_memory < LAMBDA_FULL_VCPU_MB:
        faster = replace(
            deployment, memory_mb={**deployment.memory_mb, "scheduler": LAMBDA_FULL_VCPU_MB}
        )
        alt = simulate(faster, costs, traffic, seed=seed)
        notes.append(
            f"with the scheduler's MemorySize at {LAMBDA_FULL_VCPU_MB:,} MB (one vCPU, not "
            f"{scheduler_memory:,}): the last of the burst sent at "
            f"{alt.stage('scheduler').finished_s:,.0f} s, drained "
            f"{alt.drain_seconds_after_due:,.1f} s after due"
        )
    return BurstModel(
        messages=messages,
        shards=deployment.shards,
        delay_topic_partitions=deployment.delay_topic_partitions,
        emitter_max_concurrency=normal.ceiling,
        stages=_stages(run),
        drain_seconds_after_due=None if drain is None else round(drain, 1),
        drain_messages_per_second=round(messages / drain) if drain else 0,
        lateness_after_due_ms=run.lateness_after_due[BURST].summary(),
        scheduler_runs=run.scheduler_runs,
        scheduler_messages_per_run=messages // max(1, run.scheduler_runs),
        notes=notes,
        inputs={
            "seed": seed,
            "item_bytes": item_bytes,
            "wru_per_item": wru_per_item,
            "value_bytes": value_bytes,
            "costs": asdict(costs),
            "deployment": {
                k: v for k, v in asdict(deployment).items() if k not in ("sources", "memory_mb")
            }
            | {"memory_mb": dict(deployment.memory_mb)},
            "event_sources": {p: asdict(s) for p, s in deployment.sources.items()},
            "limits": scale_limits(),
        },
    )


def scale_limits() -> dict[str, int]:
    """The documented limits the scale model applies (``sim.scale``)."""
    return {
        "dynamodb_partition_wcu": DDB_PARTITION_WCU,
        "dynamodb_partition_rcu": DDB_PARTITION_RCU,
        "dynamodb_new_on_demand_table_wru": DDB_NEW_ON_DEMAND_TABLE_WRU,
        "sqs_standard_start_concurrency": SQS_STANDARD_START_CONCURRENCY,
        "sqs_standard_scale_per_minute": SQS_STANDARD_SCALE_PER_MINUTE,
        "sqs_standard_max_concurrency": SQS_STANDARD_MAX_CONCURRENCY,
        "sqs_provisioned_scale_per_minute": SQS_PROVISIONED_SCALE_PER_MINUTE,
        "sqs_provisioned_max_concurrency": SQS_PROVISIONED_MAX_CONCURRENCY,
        "sqs_provisioned_min_pollers_max": SQS_PROVISIONED_MIN_POLLERS_MAX,
        "sqs_poller_invocations": SQS_POLLER_INVOCATIONS,
        "sqs_poller_bytes_per_second": SQS_POLLER_BYTES_PER_SECOND,
        "lambda_default_account_concurrency": LAMBDA_DEFAULT_ACCOUNT_CONCURRENCY,
        "lambda_full_vcpu_mb": LAMBDA_FULL_VCPU_MB,
        "kafka_invocations_per_partition": KAFKA_INVOCATIONS_PER_PARTITION,
    }


def steady_emitter_concurrency(per_second: float, hold_ms: float, batch: float) -> int:
    """Concurrent emitter invocations needed at a steady rate when each batch is held."""
    return math.ceil(per_second * (hold_ms / 1000) / batch)


def _watermark(pipeline: InMemoryPipeline, deadline: Deadline) -> int | None:
    """The watermark's second (None: none yet)."""
    mark = pipeline.store.read_watermark(deadline)
    return None if mark is None else mark.second
