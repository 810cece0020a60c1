"""The Lambda handlers themselves (``functions/<name>/app.py``) on the in-memory clients:
what Powertools telemetry (structured logs, EMF metrics) adds to each invocation, in CPU and
in bytes written to stdout (which CloudWatch Logs ingests and bills).

A handler module is loaded fresh, its cached ``_setup`` is replaced by one returning the
in-memory services, and stdout is captured while it runs. Same timing method as
:mod:`bench.cpu`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import os
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from bench.harness import InMemoryPipeline
from bench.reference_mix import (
    REFERENCE_MIX,
    batched,
    emitter_events,
    kafka_record,
    mixed_delays_ms,
)
from bench.template import deployed
from testkit.clock import NOW_MS
from testkit.events import kafka_event
from testkit.lambda_context import LambdaContext

ROOT: Final = Path(__file__).resolve().parent.parent


def bench_context() -> LambdaContext:
    """The context each benchmarked invocation gets: the bench function, 1 GB, ten minutes
    left (no deadline cuts a measured run short)."""
    return LambdaContext(
        function_name="delayq-bench",
        memory_limit_in_mb=1024,
        log_stream_name="bench",
        remaining_ms=600_000,
    )


class _CountingWriter(io.TextIOBase):
    """A stdout that only counts what is written."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, text: str) -> int:
        self.bytes += len(text.encode())
        return len(text)


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


TELEMETRY_ENV: Final = {
    "POWERTOOLS_METRICS_DISABLED": "false",
    "POWERTOOLS_SERVICE_NAME": "delayq",
    "POWERTOOLS_DEV": "false",
    "LOG_LEVEL": "INFO",
    "AWS_REGION": "us-east-1",
}


def load_handler_module(name: str) -> ModuleType:
    """``functions/<name>/app.py`` as a fresh module (each handler file is called app.py)."""
    path = ROOT / "functions" / name / "app.py"
    module_name = f"bench_fn_{name}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    with environ(TELEMETRY_ENV):
        spec.loader.exec_module(module)
    return module


@dataclass
class HandlerFigure:
    """CPU and log output of one handler invocation, with telemetry."""

    name: str
    messages_per_second: float
    cpu_ms_per_invocation: float
    stdout_bytes_per_invocation: float
    messages_per_invocation: float
    runs_per_second: list[float]
    method: str

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return asdict(self)


def _run_handler(
    name: str,
    *,
    setup: Callable[[InMemoryPipeline], tuple[Any, ...]],
    events: list[dict[str, Any]],
    messages: int,
    repeats: int,
    prepare_world: Callable[[InMemoryPipeline], None] | None = None,
) -> HandlerFigure:
    rates: list[float] = []
    cpus: list[float] = []
    out_bytes = 0
    for attempt in range(repeats + 1):  # the first run warms up
        pipeline = InMemoryPipeline.create()
        if prepare_world:
            prepare_world(pipeline)
        module = load_handler_module(name)
        wired = setup(pipeline)
        module.__dict__["_setup"] = lambda wired=wired: wired  # replaces the cached factory
        writer = _CountingWriter()
        context = bench_context()
        with (
            environ(TELEMETRY_ENV),
            contextlib.redirect_stdout(writer),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message="No application metrics to publish")
            gc.collect()
            start = time.process_time()
            for event in events:
                module.handler(event, context)
            cpu = time.process_time() - start
        pipeline.close()
        if attempt:
            cpus.append(cpu)
            rates.append(messages / cpu if cpu else float("inf"))
            out_bytes = writer.bytes
    cpu = statistics.median(cpus)
    return HandlerFigure(
        name=name,
        messages_per_second=statistics.median(rates),
        cpu_ms_per_invocation=cpu * 1000 / len(events),
        stdout_bytes_per_invocation=out_bytes / len(events),
        messages_per_invocation=messages / len(events),
        runs_per_second=[round(r) for r in rates],
        method="the handler module (Powertools Logger + Metrics, EMF to stdout) around the "
        "same service on in-memory clients; stdout captured and counted",
    )


def measure_handlers(
    ingest_batches: int, emitter_batches: int, repeats: int, seed: int = 7
) -> dict[str, HandlerFigure]:
    """Ingest (batches of 100 mixed records) and emitter (batches of the template's BatchSize,
    already due)."""
    import random  # noqa: PLC0415 -- only here

    rng = random.Random(seed)
    delays = mixed_delays_ms(ingest_batches * 100, REFERENCE_MIX, rng)
    now = int(time.time() * 1000)  # the handlers use the system clock
    records = [kafka_record(i, delay_ms=d, timestamp_ms=now) for i, d in enumerate(delays)]
    ingest_events = [kafka_event(*c) for c in batched(records, 100)]

    def ingest_setup(p: InMemoryPipeline) -> tuple[Any, ...]:
        from delayq.ingest import IngestServices  # noqa: PLC0415

        return (p.settings, IngestServices(p.store, p.delay_queue, p.rejects, p.payloads))

    size = deployed().emitter_batch_size
    emit_events = emitter_events(emitter_batches * size, size, due_ms=NOW_MS - 60_000)

    def emitter_setup(p: InMemoryPipeline) -> tuple[Any, ...]:
        return (p.settings, p.emitter_services())

    return {
        "ingest": _run_handler(
            "ingest",
            setup=ingest_setup,
            events=ingest_events,
            messages=len(records),
            repeats=repeats,
        ),
        "emitter": _run_handler(
            "emitter",
            setup=emitter_setup,
            events=emit_events,
            messages=emitter_batches * size,
            repeats=repeats,
        ),
    }
