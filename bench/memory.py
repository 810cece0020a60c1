"""The emitter's memory: peak resident set size of a process running the real handler.

A child process (a fresh interpreter, so nothing of the benchmark's own state counts) loads
``functions/emitter/app.py`` with Powertools, builds the emitter's real services
(``delayq.runtime.emitter_services``: boto3 clients and a confluent-kafka producer) and hands
the producer to services whose AWS side is the in-memory clients of :mod:`testkit.aws` (the
cancel-marker reads and the statistics writes answer from memory, not over the network; the
boto3 clients stay alive, so their memory counts, and the TLS contexts their first HTTPS
connections would load are loaded). The producer talks Kafka to librdkafka's
mock cluster, which runs in the parent process (its memory does not count). The child then
handles batches of the template's ``BatchSize`` of 1 KB messages, all due, repeatedly, and
reports its ``VmHWM`` (peak RSS, from ``/proc/self/status``) and its RSS after each stage.

Lambda's ``Max Memory Used`` also covers the runtime around the handler (the Python runtime
interface client, the bootstrap); no AWS page states how much that is, so an allowance is
added (:data:`RUNTIME_ALLOWANCE_MB`, an assumption) and the smallest memory setting with
twice the sum is suggested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
# What the Lambda Python runtime adds around the handler's interpreter (runtime interface
# client, bootstrap, buffers): an assumption, not a documented figure.
RUNTIME_ALLOWANCE_MB: Final = 32
HEADROOM: Final = 2.0
MEMORY_STEPS_MB: Final = (128, 192, 256, 320, 384, 512, 768, 1024)
CHILD_TIMEOUT_S: Final = 300


@dataclass
class MemoryFigure:
    """Peak RSS of the emitter process and the memory setting it suggests."""

    emitter_peak_rss_mb: float
    init_cpu_ms: float
    stages_rss_mb: dict[str, float]
    rss_after_each_batch_mb: list[float]
    batches: int
    batch_size: int
    value_bytes: int
    runtime_allowance_mb: int
    headroom: float
    suggested_memory_mb: int
    template_memory_mb: int
    python: str
    method: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return asdict(self)


def suggested_memory_mb(peak_mb: float, allowance_mb: int = RUNTIME_ALLOWANCE_MB) -> int:
    """The smallest memory setting with ``HEADROOM`` times (peak + allowance)."""
    need = HEADROOM * (peak_mb + allowance_mb)
    return next((m for m in MEMORY_STEPS_MB if m >= need), MEMORY_STEPS_MB[-1])


def measure_emitter_memory(batches: int = 100) -> MemoryFigure:
    """Run the child against a mock Kafka cluster; ``batches`` of the template's BatchSize."""
    from bench.template import deployed  # noqa: PLC0415
    from delayq_local.kafka_mock import MockKafkaCluster  # noqa: PLC0415 -- optional dependency
    from sim.scale import LAMBDA_FULL_VCPU_MB  # noqa: PLC0415 -- keeps the child's imports light

    fc = deployed()
    with MockKafkaCluster() as cluster:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), str(ROOT / "layers" / "delayq"), os.environ.get("PYTHONPATH", "")]
            ),
        }
        done = subprocess.run(  # noqa: S603 -- our own interpreter and module
            [
                sys.executable,
                "-m",
                "bench.memory",
                cluster.bootstrap_servers,
                str(batches),
                str(fc.emitter_batch_size),
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=True,
        )
    child = json.loads(done.stdout.strip().splitlines()[-1])
    peak = float(child["peak_mb"])
    init_ms = float(child["init_cpu_ms"])
    share = fc.memory_mb["emitter"] / LAMBDA_FULL_VCPU_MB
    share_1024 = 1024 / LAMBDA_FULL_VCPU_MB
    return MemoryFigure(
        emitter_peak_rss_mb=peak,
        init_cpu_ms=init_ms,
        stages_rss_mb=child["stages_mb"],
        rss_after_each_batch_mb=child["after_batch_mb"],
        batches=batches,
        batch_size=fc.emitter_batch_size,
        value_bytes=child["value_bytes"],
        runtime_allowance_mb=RUNTIME_ALLOWANCE_MB,
        headroom=HEADROOM,
        suggested_memory_mb=suggested_memory_mb(peak),
        template_memory_mb=fc.memory_mb["emitter"],
        python=child["python"],
        method="VmHWM of a fresh interpreter running functions/emitter/app.py (Powertools, "
        "real boto3 clients and their TLS contexts, confluent-kafka producer -> librdkafka mock "
        "cluster in the parent; DynamoDB/SQS calls answered by testkit.aws) over batches of due "
        "1 KB messages; "
        f"suggested = smallest setting >= {HEADROOM:g} x (peak + {RUNTIME_ALLOWANCE_MB} MB "
        "runtime allowance, assumed)",
        notes=[
            f"a cold start (interpreter, imports, clients, producer) took {init_ms:.0f} ms CPU "
            f"here: ~{init_ms / share / 1000:.1f} s at {fc.memory_mb['emitter']} MB "
            f"({share:.0%} of a vCPU), ~{init_ms / share_1024 / 1000:.1f} s at 1024 MB; it "
            "delays the first batch of each new execution environment",
            "not measured: TLS to the brokers (the mock cluster is PLAINTEXT; MSK uses TLS)",
        ],
    )


# --- the child -------------------------------------------------------------------------------


def _rss_mb(field_name: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def _tls_context() -> Any:
    from botocore.httpsession import create_urllib3_context, get_cert_path  # noqa: PLC0415

    context = create_urllib3_context()
    context.load_verify_locations(get_cert_path(True))
    return context


def _child(bootstrap: str, batches: int, batch_size: int) -> dict[str, Any]:
    stages = {"interpreter": _rss_mb()}
    import dataclasses  # noqa: PLC0415 -- measured stage by stage

    from bench.handlers import TELEMETRY_ENV, bench_context, environ, load_handler_module  # noqa: PLC0415
    from bench.harness import InMemoryPipeline  # noqa: PLC0415
    from bench.reference_mix import VALUE_BYTES, emitter_events  # noqa: PLC0415
    from delayq import runtime  # noqa: PLC0415
    from delayq.settings import Settings  # noqa: PLC0415

    module = load_handler_module("emitter")
    stages["handler imported"] = _rss_mb()
    pipeline = InMemoryPipeline.create()
    settings = pipeline.settings
    real_env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DELAYQ_KAFKA_BOOTSTRAP": bootstrap,
        "DELAYQ_TABLE_NAME": settings.table_name,
        "DELAYQ_DELAY_QUEUE_URL": settings.delay_queue_url,
        "DELAYQ_REJECT_QUEUE_URL": settings.reject_queue_url,
        "DELAYQ_DELAY_DLQ_URL": settings.delay_dlq_url,
        "DELAYQ_PAYLOAD_BUCKET": settings.payload_bucket,
        "DELAYQ_ALLOWED_TARGETS": ",".join(settings.allowed_targets),
    }
    with environ({**TELEMETRY_ENV, **real_env}):
        real = runtime.emitter_services(Settings.from_env())
    services = dataclasses.replace(pipeline.emitter_services(), delivery=real.delivery)
    # The in-memory answers skip what the first HTTPS connection of each client the emitter
    # calls (DynamoDB, SQS) loads: a TLS context with botocore's CA bundle. Load them here.
    tls = [_tls_context() for _ in ("dynamodb", "sqs")]
    module.__dict__["_setup"] = lambda: (settings, services)
    stages["services built"] = _rss_mb()
    init_cpu_ms = time.process_time() * 1000  # interpreter start, imports, clients, producer
    due_ms = int(time.time() * 1000) - 60_000
    events = emitter_events(batch_size, batch_size, due_ms)
    after: list[float] = []
    context = bench_context()
    sink = open(os.devnull, "w")  # noqa: SIM115 -- the handler's logs, for the process
    stdout, sys.stdout = sys.stdout, sink
    try:
        with environ(TELEMETRY_ENV):
            for n in range(batches):
                # A fresh event per batch, as Lambda deserialises one per invocation.
                event = json.loads(json.dumps(events[0]))
                response = module.handler(event, context)
                if response.get("batchItemFailures"):
                    raise RuntimeError(f"batch {n}: {response['batchItemFailures'][:3]}")
                after.append(round(_rss_mb(), 1))
    finally:
        sys.stdout = stdout
        sink.close()
    stages["after the batches"] = _rss_mb()
    return {
        "peak_mb": round(_rss_mb("VmHWM"), 1),
        "stages_mb": {k: round(v, 1) for k, v in stages.items()},
        "after_batch_mb": after,
        "value_bytes": VALUE_BYTES,
        "python": sys.version.split()[0],
        "init_cpu_ms": round(init_cpu_ms),
        "tls_contexts": len(tls),
    }


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
