"""Handler CPU cost: messages per second per core for ingest, scheduler and emitter.

Each figure runs the real service function (``ingest_batch``, ``run_scheduler``,
``emit_batch``) on the in-memory clients, so the I/O is removed and what remains is the
handler's own cost (plus the fakes' bookkeeping, which is small and counted against us).
CPU time is ``time.process_time()`` (all threads of the process: the scheduler queries shards
on a thread pool). Each run starts from a fresh in-memory world built outside the timed region;
one untimed warm-up run precedes the timed ones, and the median run is reported.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from bench.harness import InMemoryPipeline, bench_settings
from bench.template import deployed
from bench.workload import (
    ISSUE_7,
    NOW_MS,
    VALUE_BYTES,
    Workload,
    batched,
    delay_request,
    emitter_events,
    kafka_event,
    kafka_record,
    mixed_delays_ms,
)
from delayq import buckets

# Ten times the 1,500 creates/s per core that Lmstfy publishes for its single-node benchmark.
TARGET_PER_SECOND: Final = 15_000


@dataclass(frozen=True)
class CpuSettings:
    """How much work each run does, and how many runs."""

    ingest_batches: int = 100
    ingest_batch_size: int = 100
    scheduler_seconds: int = 24
    scheduler_per_second: int | None = None  # default: the workload's long messages per second
    emitter_batches: int = 100
    emitter_batch_size: int | None = None  # default: the template's BatchSize
    repeats: int = 7
    seed: int = 7


QUICK_CPU = CpuSettings(
    ingest_batches=3,
    scheduler_seconds=2,
    scheduler_per_second=50,
    emitter_batches=2,
    repeats=1,
)


@dataclass
class CpuFigure:
    """One handler's CPU throughput and how it was measured."""

    name: str
    messages_per_second: float
    runs_per_second: list[float]
    cpu_seconds_per_run: list[float]
    messages_per_run: int
    invocations_per_run: int
    cpu_ms_per_invocation: float
    method: str
    inputs: dict[str, Any]
    target_per_second: int | None = None
    profile: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool | None:
        """Whether the target is met (None when there is no target)."""
        if self.target_per_second is None:
            return None
        return self.messages_per_second >= self.target_per_second

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        out = asdict(self)
        out["target_met"] = self.met
        return out


@dataclass
class _Run:
    """One prepared run: the callable to time, and what it will process."""

    call: Callable[[], int]
    invocations: int
    pipeline: InMemoryPipeline


def _measure(
    prepare: Callable[[], _Run], repeats: int
) -> tuple[list[float], list[float], int, int]:
    """Time ``repeats`` fresh runs after one warm-up; returns (msgs/s, cpu s, msgs, invocations)."""
    warm = prepare()
    warm.call()
    warm.pipeline.close()
    rates: list[float] = []
    cpus: list[float] = []
    messages = invocations = 0
    for _ in range(repeats):
        run = prepare()
        gc.collect()
        start = time.process_time()
        messages = run.call()
        cpu = time.process_time() - start
        run.pipeline.close()
        invocations = run.invocations
        cpus.append(cpu)
        rates.append(messages / cpu if cpu > 0 else float("inf"))
    return rates, cpus, messages, invocations


def profile_top(prepare: Callable[[], _Run], limit: int = 18) -> list[str]:
    """cProfile one run: the functions with the most own time (file:line(function), share)."""
    run = prepare()
    profiler = cProfile.Profile()
    profiler.enable()
    run.call()
    profiler.disable()
    run.pipeline.close()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    total = sum(v[2] for v in stats.stats.values()) or 1.0  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    out = []
    for (filename, line, function), (_, calls, tottime, cumtime, _) in rows[:limit]:
        short = filename.split("/site-packages/")[-1].split("/work/main/")[-1]
        out.append(
            f"{tottime / total:6.1%} own {cumtime:7.3f}s cum {calls:>8} calls  "
            f"{short}:{line}({function})"
        )
    return out


# --- ingest ----------------------------------------------------------------------------------


def prepare_ingest(
    cfg: CpuSettings, workload: Workload = ISSUE_7
) -> tuple[Callable[[], _Run], dict[str, Any]]:
    """Kafka batches of 1 KB records with the workload's delay mix, relative to the record
    timestamp (``delay-ms``); the clock stands still at the batch's timestamp."""
    rng = random.Random(cfg.seed)
    total = cfg.ingest_batches * cfg.ingest_batch_size
    delays = mixed_delays_ms(total, workload, rng)
    records = [kafka_record(i, delay_ms=d) for i, d in enumerate(delays)]
    events = [kafka_event(chunk) for chunk in batched(records, cfg.ingest_batch_size)]

    def prepare() -> _Run:
        pipeline = InMemoryPipeline.create()

        def call() -> int:
            n = 0
            for event in events:
                result = pipeline.ingest(event)
                n += result.queued + result.stored
            return n

        return _Run(call, len(events), pipeline)

    inputs = {
        "batches": cfg.ingest_batches,
        "records_per_batch": cfg.ingest_batch_size,
        "record": f"{VALUE_BYTES} B value + 16 B key + 1 user header (1 KB)",
        "delay_mix": workload.describe(),
    }
    return prepare, inputs


# --- scheduler -------------------------------------------------------------------------------


def prepare_scheduler(
    cfg: CpuSettings, workload: Workload = ISSUE_7
) -> tuple[Callable[[], _Run], dict[str, Any]]:
    """``scheduler_seconds`` due-seconds holding ``per_second`` stored 1 KB messages each, over
    the shards; the watermark and the clock are set so that one run covers exactly them."""
    per_second = cfg.scheduler_per_second or round(workload.long_per_second)
    seconds = cfg.scheduler_seconds

    def prepare() -> _Run:
        pipeline = InMemoryPipeline.create()
        s = pipeline.settings
        first = buckets.due_second(NOW_MS) + s.lookahead_seconds + 1
        requests = [
            delay_request(i, (first + i // per_second) * 1000 + (i * 7919) % 1000)
            for i in range(seconds * per_second)
        ]
        deadline = pipeline.deadline()
        for chunk in batched(requests, 500):
            pipeline.store.put_messages(chunk, NOW_MS, deadline)
        pipeline.store.create_watermark(first - 1, NOW_MS, deadline)
        last = first + seconds - 1
        pipeline.clock.now_ms = (last - s.lookahead_seconds) * 1000

        def call() -> int:
            return pipeline.schedule().sent

        return _Run(call, 1, pipeline)

    inputs = {
        "due_seconds_per_run": seconds,
        "stored_messages_per_second": per_second,
        "shards": bench_settings().shards,
        "note": "one run = one scheduler invocation over the window (queries, bundles)",
    }
    return prepare, inputs


# --- emitter ---------------------------------------------------------------------------------


def prepare_emitter(cfg: CpuSettings) -> tuple[Callable[[], _Run], dict[str, Any]]:
    """SQS batches of delay-queue envelopes already due (nothing to hold), decoded, checked
    against cancel markers (BatchGetItem), produced to the in-memory Kafka producer, with
    the per-container lateness statistics."""
    size = cfg.emitter_batch_size or deployed().emitter_batch_size
    total = cfg.emitter_batches * size
    events = emitter_events(total, size, due_ms=NOW_MS - 1)

    def prepare() -> _Run:
        pipeline = InMemoryPipeline.create()
        services = pipeline.emitter_services()

        def call() -> int:
            n = 0
            for event in events:
                n += len(pipeline.emit(event, services).deliveries)
            return n

        return _Run(call, len(events), pipeline)

    inputs = {
        "batches": cfg.emitter_batches,
        "messages_per_batch": size,
        "batch_source": "given" if cfg.emitter_batch_size else "template.yaml BatchSize",
        "message": "1 KB envelope, due now (no hold, no re-delay)",
    }
    return prepare, inputs


# --- all three -------------------------------------------------------------------------------

METHOD: Final = (
    "time.process_time() around the real service function on in-memory AWS/Kafka clients; "
    "fresh state per run, one warm-up run, median of the timed runs"
)


def measure_all(cfg: CpuSettings, *, profile: str = "auto") -> dict[str, CpuFigure]:
    """The three figures. ``profile``: "auto" (profile a handler that misses its target),
    "always" or "never"."""
    plans: dict[str, tuple[Callable[[], _Run], dict[str, Any], int | None]] = {}
    prepare, inputs = prepare_ingest(cfg)
    plans["ingest"] = (prepare, inputs, TARGET_PER_SECOND)
    prepare, inputs = prepare_scheduler(cfg)
    plans["scheduler"] = (prepare, inputs, None)
    prepare, inputs = prepare_emitter(cfg)
    plans["emitter"] = (prepare, inputs, TARGET_PER_SECOND)
    figures: dict[str, CpuFigure] = {}
    for name, (prepare, inputs, target) in plans.items():
        rates, cpus, messages, invocations = _measure(prepare, cfg.repeats)
        cpu = statistics.median(cpus)
        figure = CpuFigure(
            name=name,
            messages_per_second=statistics.median(rates),
            runs_per_second=[round(r) for r in rates],
            cpu_seconds_per_run=[round(c, 4) for c in cpus],
            messages_per_run=messages,
            invocations_per_run=invocations,
            cpu_ms_per_invocation=cpu * 1000 / max(1, invocations),
            method=METHOD,
            inputs={**inputs, "repeats": cfg.repeats},
            target_per_second=target,
        )
        if profile == "always" or (profile == "auto" and figure.met is False):
            figure.profile = profile_top(prepare)
        figures[name] = figure
    return figures
