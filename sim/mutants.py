"""``python -m sim mutants``: does the simulator catch the defects we fixed?

Each mutant re-introduces one realistic regression (most of them defects found and fixed
before) as a one-place text edit of the product's code, in a scratch copy of the checkout.
The simulator then runs seeds on that copy, one at a time (a mutant's known seeds first),
until one breaks a guarantee: the mutant is caught, by the checker's rules that fired. A
mutant no seed catches has survived: a gap in the generator, the world or the checker.

Writes ``results/mutants.json``; exit status 1 when a mutant survived.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
# What the simulator runs: the product and its own code, copied for each mutant.
COPIED: Final = ("layers", "local", "sim", "testkit", "functions", "template.yaml")
# One seed's run may take this long at most (a long outage simulates days).
SEED_TIMEOUT_S: Final = 900


@dataclass(frozen=True)
class Mutant:
    """One regression: replace ``old`` (found exactly once in ``path``) with ``new``."""

    name: str
    defect: str
    path: str
    old: str
    new: str
    # Seeds known to catch it, tried first; ``limits``: runs with tenant limits; ``corners``:
    # False runs the workload without the contract's corners (``--no-corners``).
    seeds: tuple[int, ...] = ()
    limits: bool = False
    corners: bool = True


CATALOGUE: Final = (
    Mutant(
        "produce-early",
        "the producing loop does not hold a message until its due (or release) time",
        "layers/delayq/delayq/producing.py",
        "now = wait_until(loaded.release_at_ms, clock, sleep)",
        "now = clock()",
        (0,),
    ),
    Mutant(
        "cancel-covers-reuse",
        "a cancel applies to messages written after it (an id reused after a cancel)",
        "layers/delayq/delayq/ordering.py",
        "if self.cancel is not None and written_before(ts_ms, src, *self.cancel):",
        "if self.cancel is not None:",
        (0,),
    ),
    Mutant(
        "markers-eventually-consistent",
        "batch reads (the cancel markers the emitter checks) are eventually consistent",
        "layers/delayq/delayq/store.py",
        'spec: KeysAndAttributesTypeDef = {"Keys": pending, "ConsistentRead": True}',
        'spec: KeysAndAttributesTypeDef = {"Keys": pending, "ConsistentRead": False}',
        (1,),
    ),
    Mutant(
        "cleanup-never-redrives",
        "cleanup never re-drives a TTL removal the scheduler had not sent",
        "layers/delayq/delayq/cleanup.py",
        "if watermark is None or not watermark.scheduled(second):",
        "if False:",
        (18,),
    ),
    Mutant(
        "outage-uses-attempts",
        "an unreachable target uses up a message's delivery attempts",
        "layers/delayq/delayq/settlement.py",
        "if failure.failure is Failure.REFUSED:",
        "if failure.failure in (Failure.REFUSED, Failure.UNAVAILABLE):",
        (11,),
    ),
    Mutant(
        "outage-from-due",
        "the outage allowance counts from the due time, not the first failed delivery",
        "layers/delayq/delayq/settlement.py",
        "since_ms = max(failing_since_ms, request.release_at_ms)",
        "since_ms = request.release_at_ms",
        (18,),
    ),
    Mutant(
        "no-rescue-guard",
        "ingest does not queue what a scheduler run may have passed while it stored",
        "layers/delayq/delayq/ingest.py",
        "r for r in to_store if buckets.due_second(r.release_at_ms) <= mark.guarded_through",
        "r for r in to_store if False",
        (10,),
    ),
    Mutant(
        "direct-skips-cancels",
        "ingest's direct path produces without reading the cancel markers",
        "layers/delayq/delayq/direct.py",
        "flags = store.cancelled(requests, clock(), deadline)",
        "flags = [False] * len(requests)",
        (35,),
        corners=False,
    ),
    Mutant(
        "clock-not-raised",
        "a cancel or reschedule marker is written without raising its id's control clock",
        "layers/delayq/delayq/store.py",
        "                self._update_clock(shard, bucket, second, now_ms, deadline)",
        "                pass",
        (0,),
    ),
    Mutant(
        "clock-skips-its-second",
        "the emitter skips the markers of a control written in the message's own second",
        "layers/delayq/delayq/control_clock.py",
        "return latest >= record_second(request.ts_ms)",
        "return latest > record_second(request.ts_ms)",
        (0,),
    ),
    Mutant(
        "network-errors-not-retried",
        "botocore's network errors are not retryable",
        "layers/delayq/delayq/retry.py",
        "NETWORK_ERRORS: tuple[type[BotoCoreError], ...] = (BotoConnectionError, HTTPClientError)",
        "NETWORK_ERRORS: tuple[type[BotoCoreError], ...] = ()",
        (0,),
    ),
    Mutant(
        "pending-recounts",
        "a redelivered batch's pending counts are added again",
        "layers/delayq/delayq/pending.py",
        "rest = [e for e in entries if e.offset > seen]",
        "rest = entries",
        (5,),
    ),
    Mutant(
        "store-overwrites-versions",
        "one stored item per id and second: a later record overwrites an earlier version",
        "layers/delayq/delayq/store.py",
        "    version = request.moved_src or request.src\n    if version == request.delay_id:",
        "    version = request.delay_id\n    if version == request.delay_id:",
        (4, 43),
    ),
    Mutant(
        "payload-shared-by-versions",
        "one payload object per id: versions of an id overwrite each other's value",
        "layers/delayq/delayq/payloads.py",
        "return _version_key(request.delay_id, request.moved_src or request.src)",
        "return _version_key(request.delay_id, request.delay_id)",
        (61,),
    ),
    Mutant(
        "chain-keeps-last-step",
        "a reschedule chain in one batch applies only its last step",
        "layers/delayq/delayq/reschedule.py",
        "return [sorted(chain, key=_order) for chain in per_id.values()]",
        "return [sorted(chain, key=_order)[-1:] for chain in per_id.values()]",
        (0,),
    ),
    Mutant(
        "reschedule-keeps-original",
        "a reschedule does not drop the original: delivered at both times",
        "layers/delayq/delayq/ordering.py",
        "        return written_before(ts_ms, src, *self.moved)\n",
        "        return False\n",
        (0,),
    ),
    Mutant(
        "cap-one-over",
        "a release cap lets one message more than its rate into a second",
        "layers/delayq/delayq/shaping.py",
        "            if rank < per_second\n",
        "            if rank < per_second + 1\n",
        (0,),
        limits=True,
    ),
    Mutant(
        "quota-counter-not-idempotent",
        "a replayed claim (a lost response, a redelivered batch) adds to a tenant's counter again",
        "layers/delayq/delayq/store.py",
        'ConditionExpression="attribute_not_exists(#c)",',
        'ConditionExpression="attribute_not_exists(#c) OR attribute_exists(#c)",',
        (0,),
        limits=True,
    ),
    Mutant(
        "claim-names-the-batch",
        "a claim is named after the batch's records: a redelivered batch holding more records "
        "counts them again (a record kept by the first attempt is rejected by the retry)",
        "layers/delayq/delayq/shaping.py",
        'name = _claim_name(f"{purpose}|{head}|{rest[0][0]}|{key}|{second}")',
        'name = _claim_name(f"{purpose}|{head}|{rest[0][0]}|{rest[-1][0]}|{key}|{second}")',
        (0,),
        limits=True,
    ),
    Mutant(
        "capped-found-by-release",
        "a reschedule finds a capped message only in its due second, not where its cap put it",
        "layers/delayq/delayq/store.py",
        "        if not placed:\n            return found\n",
        "        if True:\n            return found\n",
        (0, 7, 11),
        limits=True,
    ),
    Mutant(
        "due-second-rounded-up",
        "the due-second is rounded up: a message waits in the bucket after its own",
        "layers/delayq/delayq/buckets.py",
        "    return due_ms // 1000\n",
        "    return -(-due_ms // 1000)\n",
        (0,),
    ),
)


@dataclass
class Hunt:
    """What the seeds made of one mutant."""

    name: str
    defect: str
    caught: bool = False
    seed: int | None = None
    limits: bool = False
    corners: bool = True
    # The checker's rules that fired on the catching seed, with counts.
    rules: dict[str, int] = field(default_factory=dict)
    seeds_run: int = 0
    seconds: float = 0.0


def table(hunts: Sequence[Hunt]) -> list[str]:
    """The hunts as a Markdown table (docs/mutants.md)."""
    rows = ["| mutant | regression | caught by | seed |", "|---|---|---|---|"]
    for h in hunts:
        rules = ", ".join(f"`{k}` {v}" for k, v in h.rules.items()) or "**survived**"
        options = (" `--limits`" if h.limits else "") + ("" if h.corners else " `--no-corners`")
        seed = f"{h.seed}{options}" if h.caught else "none of 0-15"
        rows.append(f"| `{h.name}` | {h.defect} | {rules} | {seed} |")
    return rows


def find_once(text: str, mutant: Mutant) -> None:
    """Raise unless ``mutant.old`` occurs exactly once in ``text`` (the catalogue is stale)."""
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"{mutant.name}: {mutant.path} holds its text {count} time(s), not once")


def plant(mutant: Mutant, into: Path, source: Path = REPO) -> Path:
    """Copy the checkout's simulated code under ``into`` and apply ``mutant`` there."""
    for name in COPIED:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, into / name)
    target = into / mutant.path
    text = target.read_text()
    find_once(text, mutant)
    target.write_text(text.replace(mutant.old, mutant.new))
    return into


def rules_of(report: dict[str, Any]) -> dict[str, int]:
    """The guarantees a ``python -m sim`` results file says were broken, with counts."""
    rules = {k: int(v) for k, v in report.get("violations", {}).items() if v}
    for name in ("lost", "early", "unacknowledged"):
        if report.get(name):
            rules[name] = int(report[name])
    return dict(sorted(rules.items()))


def hunt(mutant: Mutant, seeds: Sequence[int], python: str = sys.executable) -> Hunt:
    """Run ``mutant``'s known seeds, then ``seeds``, until one breaks a guarantee."""
    found = Hunt(mutant.name, mutant.defect, limits=mutant.limits, corners=mutant.corners)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        root = plant(mutant, Path(scratch))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(root / p) for p in _PATH))
        for seed in _ordered(mutant.seeds, seeds):
            out = root / f"seed-{seed}.json"
            command = [python, "-m", "sim", "--seeds", str(seed), "--workers", "1", "--quiet"]
            command += ["--out", str(out), *(["--limits"] if mutant.limits else [])]
            command += [] if mutant.corners else ["--no-corners"]
            subprocess.run(  # noqa: S603 -- this interpreter, fixed arguments
                command,
                cwd=root,
                env=env,
                capture_output=True,
                timeout=SEED_TIMEOUT_S,
                check=False,
            )
            found.seeds_run += 1
            rules = rules_of(json.loads(out.read_text())) if out.exists() else {"crashed": 1}
            if rules:
                found.caught, found.seed, found.rules = True, seed, rules
                break
    found.seconds = round(time.monotonic() - started, 1)
    return found


_PATH: Final = ("layers/delayq", "local", ".")


def _ordered(first: Iterable[int], then: Iterable[int]) -> list[int]:
    return list(dict.fromkeys([*first, *then]))


def main(argv: list[str]) -> int:
    from sim.__main__ import seeds_of  # noqa: PLC0415 -- __main__ imports this module

    parser = argparse.ArgumentParser(prog="python -m sim mutants", description=__doc__)
    parser.add_argument("--seeds", default="0-15", help="seeds tried after the known ones")
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--jobs", type=int, default=2, help="mutants hunted at once")
    parser.add_argument("--out", type=Path, default=Path("results/mutants.json"))
    args = parser.parse_args(argv)
    wanted = {n for n in args.only.split(",") if n}
    unknown = wanted - {m.name for m in CATALOGUE}
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
    chosen = [m for m in CATALOGUE if not wanted or m.name in wanted]
    seeds = seeds_of(args.seeds)
    print(f"hunting {len(chosen)} mutants (seeds {args.seeds} after the known ones)")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        hunts = []
        for h in pool.map(lambda m: hunt(m, seeds), chosen):
            hunts.append(h)
            options = (" --limits" if h.limits else "") + ("" if h.corners else " --no-corners")
            where = f"seed {h.seed}{options}" if h.caught else "-"
            rules = ", ".join(f"{k} {v}" for k, v in h.rules.items()) or "SURVIVED"
            print(f"  {h.name}: {where}: {rules} ({h.seeds_run} seeds, {h.seconds} s)")
    from sim.campaign import code_version  # noqa: PLC0415 -- git only when writing

    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"code": code_version(), "seeds": args.seeds, "mutants": [asdict(h) for h in hunts]}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    survived = [h.name for h in hunts if not h.caught]
    print("\n".join(table(hunts)))
    print(f"caught {len(hunts) - len(survived)} of {len(hunts)}; written {args.out}")
    if survived:
        print(f"survived: {', '.join(survived)}")
    return 1 if survived else 0
