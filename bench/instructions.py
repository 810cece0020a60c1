"""Instructions per message of each handler and its floor, counted by valgrind's callgrind.

CPU-time ratios (``bench.cpu``) move with whatever else the machine runs; instruction counts
do not. Each count is a fresh interpreter under ``valgrind --tool=callgrind`` that builds the
same inputs as ``bench.cpu`` (a handler and its floor, prepared together), runs each once
untimed (warm-up), then ``runs`` rounds that prepare a fresh run of both sides, collect
garbage and release them, calling one side (or neither: the baseline). What one side's calls
executed is its count minus the baseline's, so imports, input building, warm-up, fresh state
and collections cancel out, and what is counted is what ``bench.cpu`` times;
``PYTHONHASHSEED`` is fixed so that the runs repeat.

Callgrind runs code about 50 times slower than the CPU, so the inputs are small. Every
thread counts: the emitter pair produces to librdkafka's mock cluster, whose broker threads
do the same work for the handler and for the floor.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT_S: Final = 900
BASELINE: Final = "baseline"
# Each pair: the handler side and the floor side, as ``bench.cpu`` compares them.
PAIRS: Final[dict[str, tuple[str, str]]] = {
    "ingest": ("handler", "floor"),
    "emitter": ("handler", "floor"),
}
# Further floors counted beside a pair's, each giving the ratio named: the ingest floor
# without its deflating (the floor of the figures before 2026-11-26).
EXTRA_FLOORS: Final[dict[str, dict[str, str]]] = {
    "ingest": {"floor_without_deflate": "ingest_vs_floor_without_deflate"},
}
SIDES: Final = (BASELINE, "handler", "floor", *EXTRA_FLOORS["ingest"])
_TOTALS = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)

METHOD: Final = (
    "valgrind --tool=callgrind, instructions executed (Ir, every thread) per message: a fresh "
    "interpreter (PYTHONHASHSEED=0) builds the bench.cpu inputs of a handler and its floor, "
    "runs each once (warm-up), then rounds that prepare, gc.collect() and release both "
    "sides and call one; minus the same process calling neither (imports, inputs, warm-up, "
    "fresh state and collections cancel out: what remains is the timed call). Ingest: "
    "ingest_batch on clients that serialise each request and answer as the in-memory fakes "
    "did vs the ingest floor (decode, deflate, serialise; ingest_vs_floor_without_deflate: "
    "the floor without deflating); emitter: emit_batch "
    "producing with confluent-kafka to librdkafka's mock cluster vs the emitter floor on the "
    "same producer. Ratio = handler instructions per message / floor instructions per "
    "message; unlike CPU time, it does not move with the machine's load"
)


@dataclass(frozen=True)
class InstructionSettings:
    """How much each counted process runs (callgrind is ~50x slower than the CPU)."""

    ingest_batches: int = 5
    ingest_batch_size: int = 100
    emitter_batches: int = 3
    runs: int = 2
    workers: int = 2  # callgrind processes at a time


QUICK_INSTRUCTIONS: Final = InstructionSettings(
    ingest_batches=1, ingest_batch_size=20, emitter_batches=1, runs=1
)


@dataclass
class InstructionComparison:
    """Each handler's instructions per message as a multiple of its floor's."""

    ratios: dict[str, float | None]
    per_message: dict[str, dict[str, float]] = field(default_factory=dict)
    messages_per_run: dict[str, dict[str, int]] = field(default_factory=dict)
    runs: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    tool: str = ""
    method: str = METHOD

    def as_dict(self) -> dict[str, Any]:
        """``cpu_vs_floor.instructions`` of bench.json."""
        out = asdict(self)
        out.pop("ratios")
        return {
            **{k: None if v is None else round(v, 2) for k, v in self.ratios.items()},
            **out,
        }


def summary(comparison: InstructionComparison) -> str:
    """One line: each ratio, or why there is none."""
    return ", ".join(
        f"{name} {comparison.skipped.get(name, 'n/a')}" if ratio is None else f"{name} {ratio:.2f}x"
        for name, ratio in comparison.ratios.items()
    )


def callgrind() -> str | None:
    """The valgrind executable, or None when it is not installed."""
    return shutil.which("valgrind")


def child_environment() -> dict[str, str]:
    """The environment of a benchmark child process: this checkout's packages first."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "layers" / "delayq"), os.environ.get("PYTHONPATH", "")]
        ),
    }


def parse_totals(text: str) -> int:
    """The instruction total of a callgrind output file (its ``summary:`` or ``totals:``
    line)."""
    found = _TOTALS.search(text)
    if found is None:
        raise ValueError("no summary or totals line in the callgrind output")
    return int(found.group(1))


@dataclass(frozen=True)
class Count:
    """What one child process executed, and the messages its counted runs processed."""

    instructions: int
    messages: int


def count(valgrind: str, pair: str, side: str, cfg: InstructionSettings) -> Count:
    """Instructions one child process executed (``side`` ``cfg.runs`` times after the
    set-up)."""
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        out_file = Path(tmp) / "callgrind.out"
        done = subprocess.run(  # noqa: S603 -- valgrind on our own interpreter and module
            [
                valgrind,
                "--tool=callgrind",
                f"--callgrind-out-file={out_file}",
                sys.executable,
                "-m",
                "bench.instructions",
                pair,
                side,
                "--runs",
                str(cfg.runs),
                "--ingest-batches",
                str(cfg.ingest_batches),
                "--ingest-batch-size",
                str(cfg.ingest_batch_size),
                "--emitter-batches",
                str(cfg.emitter_batches),
            ],
            env={**child_environment(), "PYTHONHASHSEED": "0"},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=True,
        )
        child = json.loads(done.stdout.strip().splitlines()[-1])
        return Count(parse_totals(out_file.read_text()), int(child["messages"]))


def per_message(counted: Count, baseline: Count) -> float:
    """Instructions per message of the counted runs: what they added to the baseline."""
    if counted.messages <= 0:
        raise ValueError("the counted runs processed no message")
    return (counted.instructions - baseline.instructions) / counted.messages


def measure_instructions(
    cfg: InstructionSettings = InstructionSettings(),
    pairs: Sequence[str] = tuple(PAIRS),
) -> InstructionComparison:
    """Instruction ratios of the ``pairs`` (skipped, and said so, without valgrind)."""
    valgrind = callgrind()
    if valgrind is None:
        return InstructionComparison(
            ratios=dict.fromkeys(pairs),
            skipped=dict.fromkeys(pairs, "valgrind is not installed: no instruction counts"),
        )
    jobs = [
        (pair, side)
        for pair in pairs
        for side in (BASELINE, *PAIRS[pair], *EXTRA_FLOORS.get(pair, {}))
    ]
    with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
        totals = dict(
            zip(jobs, pool.map(lambda j: count(valgrind, j[0], j[1], cfg), jobs), strict=True)
        )
    comparison = InstructionComparison(ratios={}, runs=cfg.runs, tool=_version(valgrind))
    for pair in pairs:
        handler, floor_side = PAIRS[pair]
        base = totals[(pair, BASELINE)]
        extra = EXTRA_FLOORS.get(pair, {})
        counts = {
            side: per_message(totals[(pair, side)], base) for side in (handler, floor_side, *extra)
        }
        comparison.per_message[pair] = {k: round(v) for k, v in counts.items()}
        comparison.messages_per_run[pair] = {
            side: totals[(pair, side)].messages // max(1, cfg.runs) for side in counts
        }
        comparison.ratios[pair] = counts[handler] / counts[floor_side]
        for side, name in extra.items():
            comparison.ratios[name] = counts[handler] / counts[side]
    return comparison


def _version(valgrind: str) -> str:
    done = subprocess.run(  # noqa: S603 -- the valgrind found on PATH
        [valgrind, "--version"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


# --- the child -------------------------------------------------------------------------------


def _prepares(pair: str, cfg: InstructionSettings) -> tuple[Mapping[str, Callable[[], Any]], Any]:
    """The two prepared sides of ``pair`` (built together, so that the baseline builds the
    same), and what must be released at exit."""
    from bench import cpu, floor  # noqa: PLC0415 -- the child's imports are counted away

    settings = cpu.CpuSettings(
        ingest_batches=cfg.ingest_batches,
        ingest_batch_size=cfg.ingest_batch_size,
        emitter_batches=cfg.emitter_batches,
    )
    if pair == "ingest":
        captured = cpu.IngestInputs.build(settings)
        handler, _ = cpu.prepare_ingest(settings, captured)
        return {
            "handler": handler,
            "floor": cpu.prepare_ingest_floor(captured),
            "floor_without_deflate": cpu.prepare_ingest_floor(captured, deflate=False),
        }, None
    producer = floor.mock_producer()
    handler, _ = cpu.prepare_emitter(settings, producer)
    return {"handler": handler, "floor": cpu.prepare_emitter_floor(settings, producer)}, producer


def run_child(pair: str, side: str, runs: int, cfg: InstructionSettings) -> int:
    """Warm up both sides, then ``runs`` rounds that prepare, collect garbage and release
    both sides as ``bench.cpu`` does, calling only ``side`` (the baseline calls neither):
    what a count adds to the baseline is that side's calls alone, as bench.cpu times them.
    Returns the messages processed."""
    prepares, producer = _prepares(pair, cfg)
    done = 0
    try:
        for prepare in prepares.values():
            warm = prepare()
            warm.call()
            warm.close()
        for _ in range(runs):
            for name, prepare in prepares.items():
                run = prepare()
                gc.collect()
                if name == side:
                    done += run.call()
                run.close()
                del run  # freed before the next collection, whichever side ran
    finally:
        if producer is not None:
            producer.flush(30)
    return done


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.instructions PAIR SIDE``: the child a count runs under callgrind."""
    parser = argparse.ArgumentParser(prog="python -m bench.instructions")
    parser.add_argument("pair", choices=sorted(PAIRS))
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("--runs", type=int, default=InstructionSettings.runs)
    parser.add_argument("--ingest-batches", type=int, default=InstructionSettings.ingest_batches)
    parser.add_argument(
        "--ingest-batch-size", type=int, default=InstructionSettings.ingest_batch_size
    )
    parser.add_argument("--emitter-batches", type=int, default=InstructionSettings.emitter_batches)
    args = parser.parse_args(argv)
    if args.side not in (BASELINE, *PAIRS[args.pair], *EXTRA_FLOORS.get(args.pair, {})):
        parser.error(f"{args.pair} has no side {args.side}")
    cfg = InstructionSettings(
        ingest_batches=args.ingest_batches,
        ingest_batch_size=args.ingest_batch_size,
        emitter_batches=args.emitter_batches,
        runs=args.runs,
    )
    done = run_child(args.pair, args.side, args.runs, cfg)
    print(json.dumps({"pair": args.pair, "side": args.side, "messages": done}))


if __name__ == "__main__":
    main()
