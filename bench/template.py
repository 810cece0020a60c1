"""What the SAM template deploys, as the benchmarks need it: each function's memory, timeout
and architecture, and the emitter's SQS event source (batch size, batching window, maximum
concurrency). Read from ``template.yaml`` through the local runner's SAM expansion; defaults
otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
TEMPLATE: Final = ROOT / "template.yaml"
FUNCTIONS: Final = {
    "IngestFunction": "ingest",
    "TimerFunction": "timer",
    "SchedulerFunction": "scheduler",
    "EmitterFunction": "emitter",
    "CleanupFunction": "cleanup",
}


@dataclass(frozen=True)
class FunctionConfig:
    """Memory, timeouts and architecture of the deployed functions, and the emitter's event
    source."""

    memory_mb: Mapping[str, int] = field(
        default_factory=lambda: {
            "ingest": 512,
            "timer": 256,
            "scheduler": 1769,
            "emitter": 256,
            "cleanup": 512,
        }
    )
    timeout_s: Mapping[str, int] = field(
        default_factory=lambda: {
            "ingest": 60,
            "timer": 10,
            "scheduler": 60,
            "emitter": 30,
            "cleanup": 60,
        }
    )
    architecture: str = "arm64"
    emitter_max_concurrency: int = 100
    emitter_max_concurrency_limit: int = 1000
    # The high- and low-priority queues' event sources (EmitterHigh/LowMaxConcurrency).
    emitter_priority_max_concurrency: Mapping[str, int] = field(
        default_factory=lambda: {"high": 50, "low": 20}
    )
    emitter_batch_size: int = 10
    emitter_batching_window_s: float = 0.0
    # Records per ingest invocation (the Kafka event source's BatchSize: IngestBatchSize).
    ingest_batch_size: int = 100
    source: str = "defaults (template.yaml not readable)"

    @classmethod
    def from_template(cls, path: Path = TEMPLATE) -> FunctionConfig:
        """Read the template as CloudFormation deploys it (the SAM translator's output, with
        Globals merged into each function; Lambda's defaults where a property is absent)."""
        defaults = cls()
        try:
            from delayq_local.template import load_template  # noqa: PLC0415 -- optional dependency

            sam = load_template(path)
            required = {name: "x" for name, p in sam.parameters.items() if "Default" not in p}
            template = sam.expand(required, region="us-east-1")
        except Exception:  # noqa: BLE001 -- fall back to the defaults, and say so in `source`
            return defaults
        memory = dict(defaults.memory_mb)
        timeout = dict(defaults.timeout_s)
        arch = defaults.architecture
        batch, window = defaults.emitter_batch_size, defaults.emitter_batching_window_s
        for logical_id, name in FUNCTIONS.items():
            props: Mapping[str, Any] = (template.resources.get(logical_id) or {}).get(
                "Properties"
            ) or {}
            memory[name] = int(props.get("MemorySize", 128))
            timeout[name] = int(props.get("Timeout", 3))
            arch = str((props.get("Architectures") or ["x86_64"])[0])
        for resource in template.resources.values():
            props = resource.get("Properties") or {}
            if resource.get("Type") == "AWS::Lambda::EventSourceMapping" and props.get(
                "FunctionName"
            ) == {"Ref": "EmitterFunction"}:
                batch = int(props.get("BatchSize", 10))
                window = float(props.get("MaximumBatchingWindowInSeconds", 0))
        param = template.parameters.get("EmitterMaxConcurrency") or {}
        ingest_batch = (template.parameters.get("IngestBatchSize") or {}).get(
            "Default", defaults.ingest_batch_size
        )
        priority = {
            name: int(
                (template.parameters.get(f"Emitter{name.title()}MaxConcurrency") or {}).get(
                    "Default", default
                )
            )
            for name, default in defaults.emitter_priority_max_concurrency.items()
        }
        return cls(
            memory_mb=memory,
            timeout_s=timeout,
            architecture=arch,
            emitter_max_concurrency=int(param.get("Default", 100)),
            emitter_max_concurrency_limit=int(param.get("MaxValue", 1000)),
            emitter_priority_max_concurrency=priority,
            emitter_batch_size=batch,
            emitter_batching_window_s=window,
            ingest_batch_size=int(ingest_batch),
            source=path.name,
        )


@cache
def deployed() -> FunctionConfig:
    """The repository's template, read once."""
    return FunctionConfig.from_template()
