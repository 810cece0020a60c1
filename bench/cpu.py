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
import dataclasses
import gc
import io
import pstats
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from bench import floor
from bench.harness import InMemoryPipeline, bench_settings
from bench.reference_mix import (
    REFERENCE_MIX,
    VALUE_BYTES,
    Workload,
    batched,
    delay_request,
    emitter_events,
    kafka_record,
    mixed_delays_ms,
)
from bench.template import deployed
from delayq import buckets
from delayq.kafka import KafkaDelivery
from testkit.clock import NOW_MS
from testkit.events import kafka_event

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
    pipeline: InMemoryPipeline | None
    # Checks a run that was called, once done (outside the timed region), before it is
    # released (runs are also prepared and released uncalled: the instruction baseline).
    after: Callable[[], None] | None = None
    called: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        body = self.call

        def call() -> int:
            self.called = True
            return body()

        self.call = call

    def close(self) -> None:
        """Check the run if it was called, and release what it held (outside the timed
        region)."""
        try:
            if self.after is not None and self.called:
                self.after()
        finally:
            if self.pipeline is not None:
                self.pipeline.close()


@dataclass
class _Timings:
    """The timed runs of one prepared callable."""

    rates: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    messages: int = 0
    invocations: int = 0


def _measure_interleaved(
    prepares: dict[str, Callable[[], _Run]], repeats: int
) -> dict[str, _Timings]:
    """One untimed warm-up run of each, then ``repeats`` rounds timing one fresh run of each
    in turn (interleaved, so that noise on a shared machine hits them alike)."""
    for prepare in prepares.values():
        warm = prepare()
        warm.call()
        warm.close()
    out = {name: _Timings() for name in prepares}
    for _ in range(repeats):
        for name, prepare in prepares.items():
            run = prepare()
            gc.collect()
            start = time.process_time()
            messages = run.call()
            cpu = time.process_time() - start
            run.close()
            t = out[name]
            t.messages, t.invocations = messages, run.invocations
            t.cpus.append(cpu)
            t.rates.append(messages / cpu if cpu > 0 else float("inf"))
    return out


def profile_top(prepare: Callable[[], _Run], limit: int = 18) -> list[str]:
    """cProfile one run: the functions with the most own time (file:line(function), share)."""
    run = prepare()
    profiler = cProfile.Profile()
    profiler.enable()
    run.call()
    profiler.disable()
    run.close()
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


def ingest_events(cfg: CpuSettings, workload: Workload = REFERENCE_MIX) -> list[dict[str, Any]]:
    """The Kafka events of one ingest run (the same for every run)."""
    rng = random.Random(cfg.seed)
    total = cfg.ingest_batches * cfg.ingest_batch_size
    delays = mixed_delays_ms(total, workload, rng)
    records = [kafka_record(i, delay_ms=d) for i, d in enumerate(delays)]
    return [kafka_event(*chunk) for chunk in batched(records, cfg.ingest_batch_size)]


def ingest_requests(events: Sequence[Any]) -> list[floor.CapturedRequest]:
    """Every DynamoDB and SQS call the ingest handler makes for ``events``, with the
    in-memory fakes' answers (one untimed run on a fresh in-memory world)."""
    pipeline = InMemoryPipeline.create()
    captured: list[floor.CapturedRequest] = []
    floor.capture_calls(pipeline.dynamodb, floor.INGEST_CALLS["dynamodb"], captured)
    floor.capture_calls(pipeline.sqs, floor.INGEST_CALLS["sqs"], captured)
    try:
        for event in events:
            pipeline.ingest(event)
    finally:
        pipeline.close()
    return captured


@dataclass(frozen=True)
class IngestInputs:
    """The events of one ingest run (the same for every run), the calls the handler made for
    them (captured once) and the bytes it deflated."""

    events: list[dict[str, Any]]
    requests: list[floor.CapturedRequest]
    deflate: list[bytes]
    workload: Workload

    @classmethod
    def build(cls, cfg: CpuSettings, workload: Workload = REFERENCE_MIX) -> IngestInputs:
        """Events from the workload's delay mix; one capturing run on the in-memory fakes,
        which must have needed no retry (else the floor would count a write twice)."""
        events = ingest_events(cfg, workload)
        requests = ingest_requests(events)
        retried = floor.retried_calls(requests)
        if retried:
            raise AssertionError(f"the capturing run retried calls: {retried[:3]}")
        return cls(events, requests, floor.deflated_blobs(requests), workload)

    @property
    def writes(self) -> int:
        """The write requests the floor serialises."""
        return sum(r.operation in floor.INGEST_WRITES for r in self.requests)


def prepare_ingest_floor(inputs: IngestInputs, *, deflate: bool = True) -> Callable[[], _Run]:
    """The ingest floor on the events of :func:`prepare_ingest` (without deflating: the floor
    the figures before 2026-11-26 used, kept for comparison)."""
    blobs = inputs.deflate if deflate else []

    def prepare() -> _Run:
        return _Run(
            lambda: floor.ingest_floor(inputs.events, inputs.requests, blobs),
            len(inputs.events),
            None,
        )

    return prepare


def prepare_ingest(
    cfg: CpuSettings, inputs: IngestInputs | None = None, *, wire: bool = True
) -> tuple[Callable[[], _Run], dict[str, Any]]:
    """Kafka batches of 1 KB records with the workload's delay mix, relative to the record
    timestamp (``delay-ms``); the clock stands still at the batch's timestamp. ``wire``: the
    DynamoDB and SQS clients serialise each request and answer what the capturing run's fakes
    answered (:func:`bench.floor.replay_calls`); else the in-memory fakes do the work."""
    inputs = inputs or IngestInputs.build(cfg)
    events = inputs.events

    def prepare() -> _Run:
        pipeline = InMemoryPipeline.create()
        replaying = floor.Replaying()
        if wire:
            for client, methods in (
                (pipeline.dynamodb, floor.INGEST_CALLS["dynamodb"]),
                (pipeline.sqs, floor.INGEST_CALLS["sqs"]),
            ):
                floor.replay_calls(client, methods, inputs.requests, replaying)

        def call() -> int:
            n = 0
            for event in events:
                result = pipeline.ingest(event)
                n += result.queued + result.stored
            return n

        return _Run(call, len(events), pipeline, replaying.check_done)

    description = {
        "batches": cfg.ingest_batches,
        "records_per_batch": cfg.ingest_batch_size,
        "record": f"{VALUE_BYTES} B value + 16 B key + 1 user header (1 KB)",
        "delay_mix": inputs.workload.describe(),
        "clients": "serialise and replay" if wire else "in-memory fakes",
    }
    return prepare, description


# --- scheduler -------------------------------------------------------------------------------


def prepare_scheduler(
    cfg: CpuSettings, workload: Workload = REFERENCE_MIX
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


def emitter_inputs(cfg: CpuSettings) -> list[dict[str, Any]]:
    """The SQS events of one emitter run (the same for every run)."""
    size = cfg.emitter_batch_size or deployed().emitter_batch_size
    return emitter_events(cfg.emitter_batches * size, size, due_ms=NOW_MS - 1)


def prepare_emitter_floor(cfg: CpuSettings, producer: Any) -> Callable[[], _Run]:
    """The emitter floor on the events of :func:`prepare_emitter`, producing to ``producer``
    (a real confluent-kafka producer in the benchmark) at the handler's clock (``NOW_MS``)."""
    events = emitter_inputs(cfg)
    reports = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            reports[0] += 1

    def prepare() -> _Run:
        return _Run(
            lambda: floor.emitter_floor(events, producer, lambda: NOW_MS, on_delivery),
            len(events),
            None,
        )

    return prepare


def prepare_emitter(
    cfg: CpuSettings, producer: Any = None
) -> tuple[Callable[[], _Run], dict[str, Any]]:
    """SQS batches of delay-queue envelopes already due (nothing to hold), decoded, checked
    against cancel markers (BatchGetItem), produced to the in-memory Kafka producer (or to
    ``producer``, a real one), with the per-container lateness statistics."""
    size = cfg.emitter_batch_size or deployed().emitter_batch_size
    events = emitter_inputs(cfg)

    def prepare() -> _Run:
        pipeline = InMemoryPipeline.create()
        services = pipeline.emitter_services()
        if producer is not None:
            services = dataclasses.replace(
                services,
                delivery=KafkaDelivery(
                    lambda _on_error: producer, pipeline.settings.kafka_timeout_seconds
                ),
            )

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
        "producer": "in-memory fake"
        if producer is None
        else "confluent-kafka on librdkafka's mock cluster",
    }
    return prepare, inputs


# --- all three, and the floors ---------------------------------------------------------------

METHOD: Final = (
    "time.process_time() around the real service function on in-memory AWS/Kafka clients; "
    "fresh state per run, one warm-up run, median of the timed runs. Messages per second "
    "per core are machine-dependent (they vary about threefold between shared machines): "
    "compare machines with cpu_vs_floor"
)

FLOOR_GOAL: Final = 3.0

FLOOR_METHOD: Final = (
    "handler CPU per message / floor CPU per message, both medians of the same number of "
    "timed runs (time.process_time(), one warm-up each, fresh state per run), interleaved "
    "run by run on the same events in the same process. Ingest floor: base64 of every "
    "record's key and value and the header values (lists of signed byte ints) to bytes, "
    "zlib.compress at the store's level of every key and value the handler stored deflated "
    "(those bytes are in the requests: no implementation writes them without deflating), "
    "plus json.dumps of the DynamoDB BatchWriteItem and SQS SendMessageBatch parameters the "
    "handler sent for the same events (captured from the in-memory fakes in an untimed run; "
    "DynamoDB blobs as base64, as botocore sends them). Neither side json.loads the event "
    "text: both get the event as a dict, as Lambda's runtime hands it over. The handler side "
    "runs on clients that json.dumps every request (writes, pending-count updates, watermark "
    "reads) the same way and answer what the fakes answered in the capturing run, so both "
    "sides pay the same per byte for the wire and neither for an emulator's bookkeeping. "
    "ingest_vs_floor_without_deflate divides by the floor without the deflating; "
    "ingest_in_memory_store is the method of the figures before 2026-11-26 (handler on the "
    "in-memory fakes, floor without deflating). Emitter floor: "
    "json.loads of every SQS body, base64 of key, value and header values of every envelope "
    "in it, the four delivery headers, one confluent_kafka Producer.produce() per record "
    "(with a delivery callback) and one flush() per SQS batch, as the handler does. The "
    "emitter ratio uses the handler measured with the same real producer (confluent-kafka on "
    "librdkafka's mock cluster, in-process brokers, PLAINTEXT, idempotent, acks=all), so that "
    "both do the same produce and delivery-report work (the mock brokers' CPU is in both); "
    "the emitter's headline rate uses the in-memory fake producer, and its ratio to the same "
    "floor is given as emitter_fake_producer for reference only. The same ratios in "
    "instructions executed (valgrind's callgrind: they do not move with the machine's load) "
    "are under instructions, with their method"
)


@dataclass
class FloorComparison:
    """Each handler's CPU per message as a multiple of its floor's, from the same run."""

    ratios: dict[str, float | None]
    floor_messages_per_second: dict[str, float]
    handler_messages_per_second: dict[str, float]
    floor_cpu_seconds_per_run: dict[str, list[float]]
    messages_per_run: dict[str, int]
    requests_serialised_per_run: int
    produce_calls_per_run: int
    extra_ratios: dict[str, float | None] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    goal: float = FLOOR_GOAL
    method: str = FLOOR_METHOD
    # The instruction-count ratios (``bench.instructions``), when they were counted.
    instructions: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """``cpu_vs_floor`` of bench.json."""
        met = {name: (None if r is None else r <= self.goal) for name, r in self.ratios.items()}
        return {
            **{name: _round(r) for name, r in self.ratios.items()},
            "method": self.method,
            "floor_messages_per_second": {
                k: round(v) for k, v in self.floor_messages_per_second.items()
            },
            "handler_messages_per_second": {
                k: round(v) for k, v in self.handler_messages_per_second.items()
            },
            "floor_cpu_seconds_per_run": self.floor_cpu_seconds_per_run,
            "messages_per_run": self.messages_per_run,
            "requests_serialised_per_run": self.requests_serialised_per_run,
            "produce_calls_per_run": self.produce_calls_per_run,
            **{name: _round(r) for name, r in self.extra_ratios.items()},
            "skipped": self.skipped,
            "goal": self.goal,
            "met": met,
            "instructions": self.instructions,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def measure_all(cfg: CpuSettings, *, profile: str = "auto") -> dict[str, CpuFigure]:
    """The three figures. ``profile``: "auto" (profile a handler that misses its target),
    "always" or "never"."""
    return measure_with_floor(cfg, profile=profile)[0]


def _figure(
    name: str,
    t: _Timings,
    inputs: dict[str, Any],
    target: int | None,
    repeats: int,
) -> CpuFigure:
    cpu = statistics.median(t.cpus)
    return CpuFigure(
        name=name,
        messages_per_second=statistics.median(t.rates),
        runs_per_second=[round(r) for r in t.rates],
        cpu_seconds_per_run=[round(c, 4) for c in t.cpus],
        messages_per_run=t.messages,
        invocations_per_run=t.invocations,
        cpu_ms_per_invocation=cpu * 1000 / max(1, t.invocations),
        method=METHOD,
        inputs={**inputs, "repeats": repeats},
        target_per_second=target,
    )


def _per_message(t: _Timings) -> float:
    return statistics.median(t.cpus) / max(1, t.messages)


def measure_with_floor(
    cfg: CpuSettings, *, profile: str = "auto"
) -> tuple[dict[str, CpuFigure], FloorComparison]:
    """The three figures and each handler's ratio to its floor, the floors timed interleaved
    with their handlers (ingest with the ingest floor; the emitter on the fake producer, on a
    real producer and the emitter floor)."""
    figures: dict[str, CpuFigure] = {}
    skipped: dict[str, str] = {}

    ingest_t, ingest_prepare, ingest_in, requests = _time_ingest(cfg)
    # The per-core rate keeps its method (the in-memory clients), like the other two.
    figures["ingest"] = _figure(
        "ingest", ingest_t["in_memory"], ingest_in, TARGET_PER_SECOND, cfg.repeats
    )

    prepare, inputs = prepare_scheduler(cfg)
    scheduler_t = _measure_interleaved({"run": prepare}, cfg.repeats)["run"]
    figures["scheduler"] = _figure("scheduler", scheduler_t, inputs, None, cfg.repeats)

    emitter_prepare, emitter_in = prepare_emitter(cfg)
    plans: dict[str, Callable[[], _Run]] = {"fake": emitter_prepare}
    producer = None
    try:
        producer = floor.mock_producer()
    except Exception as e:  # noqa: BLE001 -- reported; the other figures still stand
        skipped["emitter"] = f"no real producer: {type(e).__name__}: {e}"
    if producer is not None:
        plans["real"] = prepare_emitter(cfg, producer)[0]
        plans["floor"] = prepare_emitter_floor(cfg, producer)
    try:
        emitter_t = _measure_interleaved(plans, cfg.repeats)
    finally:
        if producer is not None:
            producer.flush(30)
            producer.purge()
    figures["emitter"] = _figure(
        "emitter", emitter_t["fake"], emitter_in, TARGET_PER_SECOND, cfg.repeats
    )

    for name, figure in figures.items():
        if profile == "always" or (profile == "auto" and figure.met is False):
            prep = {
                "ingest": ingest_prepare,
                "scheduler": prepare,
                "emitter": emitter_prepare,
            }[name]
            figure.profile = profile_top(prep)

    comparison = _comparison(ingest_t, emitter_t, requests, skipped)
    return figures, comparison


def _time_ingest(
    cfg: CpuSettings,
) -> tuple[dict[str, _Timings], Callable[[], _Run], dict[str, Any], int]:
    """Ingest (on serialising clients, and on the in-memory fakes) and its floor (with and
    without deflating) timed interleaved; with the prepare and inputs of the handler on the
    in-memory fakes (the per-core figure and its profile) and the number of write requests
    the floor serialises."""
    captured = IngestInputs.build(cfg)
    ingest_prepare, _ = prepare_ingest(cfg, captured)
    in_memory_prepare, in_memory_in = prepare_ingest(cfg, captured, wire=False)
    timings = _measure_interleaved(
        {
            "handler": ingest_prepare,
            "in_memory": in_memory_prepare,
            "floor": prepare_ingest_floor(captured),
            "floor_without_deflate": prepare_ingest_floor(captured, deflate=False),
        },
        cfg.repeats,
    )
    return timings, in_memory_prepare, in_memory_in, captured.writes


def _ingest_extra_ratios(t: dict[str, _Timings]) -> dict[str, float | None]:
    """The ingest ratios beside the goal's: against the floor without deflating, and the
    method of the figures before 2026-11-26 (in-memory fakes against that floor)."""
    without = _per_message(t["floor_without_deflate"])
    return {
        "ingest_vs_floor_without_deflate": floor.ratio(_per_message(t["handler"]), without),
        "ingest_in_memory_store": floor.ratio(_per_message(t["in_memory"]), without),
    }


def ingest_against_floor(cfg: CpuSettings) -> dict[str, Any]:
    """Only ingest against its floor, timed exactly as :func:`measure_with_floor` times them
    (the ingest rows of ``make bench`` in a minute: ``python -m bench.ingest_ratio``)."""
    timings, _, _, requests = _time_ingest(cfg)
    handler, fl = timings["handler"], timings["floor"]
    return {
        "ingest": _round(floor.ratio(_per_message(handler), _per_message(fl))),
        **{k: _round(v) for k, v in _ingest_extra_ratios(timings).items()},
        "handler_messages_per_second": round(statistics.median(handler.rates)),
        "floor_messages_per_second": round(statistics.median(fl.rates)),
        "handler_cpu_seconds_per_run": [round(c, 4) for c in handler.cpus],
        "floor_cpu_seconds_per_run": [round(c, 4) for c in fl.cpus],
        "messages_per_run": handler.messages,
        "requests_serialised_per_run": requests,
    }


def _comparison(
    ingest_t: dict[str, _Timings],
    emitter_t: dict[str, _Timings],
    requests: int,
    skipped: dict[str, str],
) -> FloorComparison:
    """Ratios and floor rates from the interleaved timings."""
    ratios: dict[str, float | None] = {
        "ingest": floor.ratio(_per_message(ingest_t["handler"]), _per_message(ingest_t["floor"]))
    }
    floor_rates = {"ingest": statistics.median(ingest_t["floor"].rates)}
    handler_rates = {"ingest": statistics.median(ingest_t["handler"].rates)}
    floor_cpus = {"ingest": [round(c, 4) for c in ingest_t["floor"].cpus]}
    messages_per_run = {
        "ingest": ingest_t["handler"].messages,
        "ingest_floor": ingest_t["floor"].messages,
    }
    extra = {**_ingest_extra_ratios(ingest_t), "emitter_fake_producer": None}
    produce_calls = 0
    if "floor" in emitter_t:
        real, fl = emitter_t["real"], emitter_t["floor"]
        ratios["emitter"] = floor.ratio(_per_message(real), _per_message(fl))
        extra["emitter_fake_producer"] = floor.ratio(
            _per_message(emitter_t["fake"]), _per_message(fl)
        )
        floor_rates["emitter"] = statistics.median(fl.rates)
        handler_rates["emitter"] = statistics.median(real.rates)
        floor_cpus["emitter"] = [round(c, 4) for c in fl.cpus]
        messages_per_run["emitter"] = real.messages
        messages_per_run["emitter_floor"] = fl.messages
        produce_calls = fl.messages
    else:
        ratios["emitter"] = None
    comparison = FloorComparison(
        ratios=ratios,
        floor_messages_per_second=floor_rates,
        handler_messages_per_second=handler_rates,
        floor_cpu_seconds_per_run=floor_cpus,
        messages_per_run=messages_per_run,
        requests_serialised_per_run=requests,
        produce_calls_per_run=produce_calls,
        extra_ratios=extra,
        skipped=skipped,
    )
    return comparison
