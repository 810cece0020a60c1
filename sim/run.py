"""One seeded run, and campaigns of many.

A run: draw the run's faults (a scheduler outage longer than the TTL grace, target-cluster
outages), generate the workload, let producers write it, run the world until every message
had its chance (the last due time, the outages, the TTL grace and lag), then check.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Final

from delayq.settings import Settings
from sim.checker import BUCKET_MS, Checker, Verdict
from sim.faults import Knobs
from sim.iam import roles
from sim.pipeline import Pipeline, limited_settings
from sim.workload import Intent, Shape, Workload, generate
from sim.world import World
from testkit.clock import NOW_MS

# After the last due time: time for retries, duplicates and the emitter's outage back-off.
SETTLE_MS: Final = 30 * 60_000


@dataclass
class RunResult:
    """What one seed did and what the checker found."""

    seed: int
    simulated_ms: int
    verdict: Verdict
    faults: Counter[str]
    invocations: dict[str, int]
    iam_checked: int
    fingerprint: str  # a digest of the run's history: the same seed gives the same one
    stories: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No guarantee broken."""
        return not self.verdict.violations and not self.verdict.unacknowledged


def simulate(
    seed: int, shape: Shape, knobs: Knobs, settings: Settings | None = None
) -> tuple[Pipeline, Workload]:
    """Run one seed's world to its end; what it recorded is in the pipeline. ``settings``
    replace the simulation's own (``sim.pipeline.sim_settings``, or ``limited_settings`` with
    the tenant limits of a shape that has them)."""
    world = World(seed, NOW_MS)
    start = world.now_ms + 60_000
    workload = generate(world.rng, start, shape)
    if settings is None and workload.limits:
        settings = limited_settings(roles(), workload.limits)
    pipeline = Pipeline(world, knobs, settings)
    end = _plan_outages(world, knobs, pipeline, start, workload)
    pipeline.operator.plan(start, min(workload.last_due_ms, end - SETTLE_MS), end - SETTLE_MS)
    for intent in workload.intents:
        world.at(intent.send_ms, partial(_write, pipeline, intent))
    pipeline.start(end)
    try:
        world.run_until(end)
    finally:
        world.stop()
    return pipeline, workload


def run_seed(seed: int, shape: Shape | None = None, knobs: Knobs | None = None) -> RunResult:
    """Simulate one seed from scratch and check it (default shape and knobs)."""
    pipeline, workload = simulate(seed, shape or Shape(), knobs or Knobs())
    checker = Checker(pipeline, workload)
    verdict = checker.run()
    broken = sorted({v.delay_id for v in verdict.violations})[:5]
    return RunResult(
        seed=seed,
        simulated_ms=pipeline.world.now_ms - NOW_MS,
        verdict=verdict,
        faults=pipeline.world.faults,
        invocations=dict(pipeline.functions.invocations),
        iam_checked=pipeline.roles.guard.checked,
        fingerprint=_fingerprint(pipeline),
        stories={b: checker.story(b) for b in broken},
    )


def _write(pipeline: Pipeline, intent: Intent) -> None:
    intent.offset = len(pipeline.kafka.partitions[intent.partition].records)
    pipeline.kafka.write(intent.partition, intent.record())


def _plan_outages(
    world: World, knobs: Knobs, pipeline: Pipeline, start: int, workload: Workload
) -> int:
    """Draw this run's long outages; returns when the run ends."""
    end = workload.last_due_ms + SETTLE_MS
    grace_ms = pipeline.settings.ttl_grace_seconds * 1000
    if world.chance(knobs.scheduler_outage, "scheduler-outage"):
        down = start + world.rng.randint(0, 20 * 60_000)
        up = down + grace_ms + world.rng.randint(5 * 60_000, 60 * 60_000)
        pipeline.ticks.down = (down, up)
        world.note(f"scheduler down until {up}")
        end = max(end, up + SETTLE_MS)
    if world.chance(knobs.kafka_outage, "kafka-outage"):
        down = start + world.rng.randint(0, 60 * 60_000)
        up = down + world.rng.randint(60_000, max(60_000, knobs.kafka_outage_max_s * 1000))
        pipeline.cluster.outages.append((down, up))
        world.note(f"target cluster down until {up}")
        end = max(end, up + SETTLE_MS)
    if world.chance(knobs.ingest_stall, "ingest-stall"):
        since = start + world.rng.randint(0, 20 * 60_000)
        until = since + world.rng.randint(10_000, 5 * 60_000)
        partition = world.rng.randrange(len(pipeline.kafka.partitions))
        pipeline.kafka.stalls.append((partition, since, until))
    if world.chance(knobs.ingest_clock_behind, "ingest-clock-behind"):
        pipeline.ingest_behind_ms = world.rng.randint(60_000, 180_000)
    # Stored messages expire at due + grace and TTL may take ttl_lag_s more to delete them:
    # the safety net's re-drives happen by then.
    end += grace_ms + knobs.ttl_lag_s * 1000
    if world.chance(knobs.cleanup_outage, "cleanup-outage"):
        since = start + world.rng.randint(0, end - start)
        until = since + world.rng.randint(
            3_600_000, max(3_600_000, knobs.cleanup_outage_max_s * 1000)
        )
        pipeline.stream.down = (since, until)
        world.note(f"cleanup cannot be invoked until {until}")
        end = max(end, until + SETTLE_MS)
    return end


def _fingerprint(pipeline: Pipeline) -> str:
    digest = hashlib.sha256()
    for produced in pipeline.cluster.log:
        digest.update(f"{produced.at_ms}|{produced.function}|{produced.record.headers}".encode())
    for line in pipeline.world.history:
        digest.update(line.encode())
    digest.update(repr(sorted(pipeline.counter.calls.items())).encode())
    return digest.hexdigest()[:16]


# --- campaigns ---------------------------------------------------------------------------


def _one(args: tuple[int, Shape, Knobs]) -> RunResult:
    return run_seed(*args)


def campaign(
    seeds: Iterable[int], shape: Shape, knobs: Knobs, workers: int = 1
) -> Iterator[RunResult]:
    """Results seed by seed (in seed order), over ``workers`` processes."""
    jobs = [(seed, shape, knobs) for seed in seeds]
    if workers <= 1:
        yield from map(_one, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=50) as pool:
        yield from pool.imap(_one, jobs)


@dataclass
class Summary:
    """A campaign's totals (what ``results/sim.json`` holds)."""

    seeds: list[int] = field(default_factory=list)
    messages: int = 0
    simulated_ms: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)  # by kind (checker.Violation)
    duplicates: int = 0
    unacknowledged: int = 0
    iam_checked: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    rejected: int = 0
    over_quota: int = 0
    limited: int = 0
    lateness: Counter[int] = field(default_factory=Counter)
    steady_lateness: Counter[int] = field(default_factory=Counter)
    limited_lateness: Counter[int] = field(default_factory=Counter)
    coverage: Counter[str] = field(default_factory=Counter)
    failing: list[int] = field(default_factory=list)
    # The code that runs the seeds counted in by add() (sim.campaign.code_version), and the
    # seeds each code ran, by (commit, dirty).
    version: dict[str, Any] = field(default_factory=lambda: {"commit": None, "dirty": None})
    code: dict[tuple[str | None, bool | None], list[int]] = field(default_factory=dict)
    # Wall seconds: since ``started`` (None: not running), plus those of merged shards.
    started: float | None = field(default_factory=time.monotonic)
    wall_s: float = 0.0

    def add(self, result: RunResult) -> None:
        """Count one seed in (run by this summary's ``version`` of the code)."""
        self.absorb(self.of_seed(result, self.version))

    @classmethod
    def of_seed(cls, result: RunResult, version: Mapping[str, Any]) -> Summary:
        """One seed's figures, as a summary that :meth:`absorb` adds to another."""
        v = result.verdict
        return cls(
            seeds=[result.seed],
            messages=v.messages,
            simulated_ms=result.simulated_ms,
            faults=Counter(result.faults),
            violations=Counter(violation.kind for violation in v.violations),
            duplicates=v.duplicates,
            unacknowledged=v.unacknowledged,
            iam_checked=result.iam_checked,
            delivered=v.delivered,
            dead_lettered=v.dead_lettered,
            cancelled=v.cancelled,
            rejected=v.rejected,
            over_quota=v.over_quota,
            limited=v.limited,
            lateness=Counter(v.lateness),
            steady_lateness=Counter(v.steady_lateness),
            limited_lateness=Counter(v.limited_lateness),
            coverage=Counter(v.coverage),
            failing=[] if result.ok else [result.seed],
            code={(version["commit"], version["dirty"]): [result.seed]},
            started=None,
        )

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> Summary:
        """The summary a results file (a shard, see :mod:`sim.campaign`) was written from."""
        outcomes = report["outcomes"]
        histograms = report["lateness_histogram"]
        return cls(
            seeds=seeds_in(report["seeds"]["ranges"]),
            messages=report["messages"],
            simulated_ms=report["simulated_ms"],
            faults=Counter(report["faults"]),
            violations=Counter(report["violations"]),
            duplicates=report["duplicates"],
            unacknowledged=report["unacknowledged"],
            iam_checked=report["iam_calls_checked"],
            delivered=outcomes["delivered"],
            dead_lettered=outcomes["dead_lettered"],
            cancelled=outcomes["cancelled"],
            rejected=outcomes["rejected"],
            over_quota=outcomes["rejected_over_quota"],
            limited=outcomes["delivered_limited"],
            lateness=histogram_of(histograms["all"]),
            steady_lateness=histogram_of(histograms["away_from_outages"]),
            limited_lateness=histogram_of(histograms["limited_from_release"]),
            coverage=Counter(report.get("coverage", {})),
            failing=list(report["failing_seeds"]),
            code={
                (entry["commit"], entry["dirty"]): seeds_in(entry["seeds"])
                for entry in report["code"]
            },
            started=None,
            wall_s=report["wall_seconds"],
        )

    def absorb(self, other: Summary) -> None:
        """Count another summary's seeds in (seeds disjoint from these)."""
        self.seeds.extend(other.seeds)
        self.messages += other.messages
        self.simulated_ms += other.simulated_ms
        self.faults.update(other.faults)
        self.violations.update(other.violations)
        self.duplicates += other.duplicates
        self.unacknowledged += other.unacknowledged
        self.iam_checked += other.iam_checked
        self.delivered += other.delivered
        self.dead_lettered += other.dead_lettered
        self.cancelled += other.cancelled
        self.rejected += other.rejected
        self.over_quota += other.over_quota
        self.limited += other.limited
        self.lateness.update(other.lateness)
        self.steady_lateness.update(other.steady_lateness)
        self.limited_lateness.update(other.limited_lateness)
        self.coverage.update(other.coverage)
        self.failing = sorted(self.failing + other.failing)
        for version, seeds in other.code.items():
            self.code.setdefault(version, []).extend(seeds)
        self.wall_s += other.wall_seconds()

    def wall_seconds(self) -> float:
        """Wall time spent on these seeds."""
        running = time.monotonic() - self.started if self.started is not None else 0.0
        return self.wall_s + running

    @staticmethod
    def lateness_of(histogram: Counter[int]) -> dict[str, int]:
        """p50, p99 and max of a lateness histogram (ms, to its 10 ms buckets)."""
        total = sum(histogram.values())
        figures = {
            "messages": total,
            "p50": 0,
            "p99": 0,
            "max": max(histogram, default=0) * BUCKET_MS,
        }
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            seen = 0
            for bucket in sorted(histogram):
                seen += histogram[bucket]
                if seen > q * (total - 1):
                    figures[name] = bucket * BUCKET_MS
                    break
        return figures

    def as_dict(
        self, shape: Shape | Mapping[str, Any], knobs: Knobs | Mapping[str, Any]
    ) -> dict[str, Any]:
        """The results file (``shape`` and ``knobs`` as given, or as a shard recorded them)."""
        return {
            "seeds": {
                "count": len(self.seeds),
                "first": min(self.seeds, default=0),
                "last": max(self.seeds, default=0),
                "ranges": ranges(self.seeds),
            },
            "messages": self.messages,
            "simulated_hours": round(self.simulated_ms / 3_600_000, 1),
            "simulated_ms": self.simulated_ms,
            "faults": dict(sorted(self.faults.items())),
            "lost": self.violations["lost"],
            "early": self.violations["early"],
            "duplicates": self.duplicates,
            "violations": dict(sorted(self.violations.items())),
            "unacknowledged": self.unacknowledged,
            "iam_calls_checked": self.iam_checked,
            "outcomes": {
                "delivered": self.delivered,
                "dead_lettered": self.dead_lettered,
                "cancelled": self.cancelled,
                "rejected": self.rejected,
                "rejected_over_quota": self.over_quota,
                "delivered_limited": self.limited,
            },
            "lateness_ms": self.lateness_of(self.lateness),
            "lateness_away_from_outages_ms": self.lateness_of(self.steady_lateness),
            # Of capped or deferred tenants' messages, from their release (not in the above).
            "lateness_limited_from_release_ms": self.lateness_of(self.limited_lateness),
            # Exact, for merging shards: the percentiles above come from these.
            "lateness_histogram": {
                "bucket_ms": BUCKET_MS,
                "all": histogram_json(self.lateness),
                "away_from_outages": histogram_json(self.steady_lateness),
                "limited_from_release": histogram_json(self.limited_lateness),
            },
            # Acknowledged messages whose history exercised each clause of the contract.
            "coverage": dict(sorted(self.coverage.items())),
            "failing_seeds": self.failing,
            "wall_seconds": round(self.wall_seconds(), 1),
            "code": sorted(
                (
                    {"commit": commit, "dirty": dirty, "seeds": ranges(seeds)}
                    for (commit, dirty), seeds in self.code.items()
                ),
                key=lambda entry: entry["seeds"],
            ),
            "shape": dict(shape) if isinstance(shape, Mapping) else asdict(shape),
            "knobs": dict(knobs) if isinstance(knobs, Mapping) else asdict(knobs),
        }


def ranges(seeds: Iterable[int]) -> list[list[int]]:
    """Seeds as sorted ``[first, last]`` runs: ``[0, 1, 2, 7]`` -> ``[[0, 2], [7, 7]]``."""
    out: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if out and seed == out[-1][1] + 1:
            out[-1][1] = seed
        else:
            out.append([seed, seed])
    return out


def seeds_in(runs: Iterable[Sequence[int]]) -> list[int]:
    """The seeds of ``[first, last]`` runs."""
    return [seed for first, last in runs for seed in range(first, last + 1)]


def histogram_json(histogram: Counter[int]) -> dict[str, int]:
    """A lateness histogram as JSON: each bucket's lower bound in ms -> messages."""
    return {str(bucket * BUCKET_MS): histogram[bucket] for bucket in sorted(histogram)}


def histogram_of(data: Mapping[str, int]) -> Counter[int]:
    """The inverse of :func:`histogram_json`."""
    return Counter({int(ms) // BUCKET_MS: int(n) for ms, n in data.items()})
