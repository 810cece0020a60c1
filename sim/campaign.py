"""Long campaigns in chunks: every results file ``python -m sim`` writes is a shard that holds
what an exact merge needs, and ``python -m sim merge`` adds shards up.

A shard has, besides the summary: its seeds as ranges, the exact lateness histograms (the
checker's 10 ms buckets, from which the percentiles are computed), the exact simulated
milliseconds, and the code that ran it (the git commit, and whether the tracked files had
changes). Shards merge only when they ran the same shape and knobs over disjoint seeds; the
merge is itself a shard, so merged campaigns merge again.

A campaign is kept in the repository as a digest (``python -m sim digest``): per shard its
seeds, the commit that ran it, its figures and a checksum of what it found (every field but
the wall time and the code, so a shard run again from its seeds on its commit has the same
one), and the merged figures without the histograms. The shards themselves are not kept: any
of them is reproduced from its seeds and commit.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from sim.checker import BUCKET_MS
from sim.run import Summary, ranges, seeds_in

REPO: Final = Path(__file__).resolve().parent.parent


class ShardError(ValueError):
    """Shards that cannot be merged exactly (the message says why)."""


def code_version(repo: Path = REPO) -> dict[str, Any]:
    """``{"commit": ..., "dirty": ...}`` of the checkout at ``repo``: HEAD's commit and
    whether tracked files differ from it (both None without git or outside a checkout)."""
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(  # noqa: S603 -- git on PATH, fixed arguments, this checkout
        ["git", "-C", str(repo), *args],  # noqa: S607
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout


def text_of(runs: Iterable[Sequence[int]]) -> str:
    """``0-2,7`` (as ``--seeds`` takes them)."""
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def load(path: Path) -> dict[str, Any]:
    """A shard, checked to hold what a merge needs."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ShardError(f"{path}: cannot be read as a results file ({e})") from e
    missing = [k for k in ("lateness_histogram", "code", "simulated_ms") if k not in report]
    if missing or "ranges" not in report.get("seeds", {}):
        raise ShardError(
            f"{path}: not a shard (no {', '.join(missing) or 'seed ranges'}): it was written "
            "before shards existed; run its seeds again"
        )
    if report["lateness_histogram"].get("bucket_ms") != BUCKET_MS:
        raise ShardError(f"{path}: lateness buckets are not {BUCKET_MS} ms")
    return dict(report)


def merge(shards: Sequence[tuple[Path, dict[str, Any]]]) -> Summary:
    """One summary of ``shards`` (path, report): refused when their shapes or knobs differ
    or their seeds overlap."""
    if not shards:
        raise ShardError("no shard to merge")
    first_path, first = shards[0]
    for path, report in shards[1:]:
        for what in ("shape", "knobs"):
            if report[what] != first[what]:
                differ = sorted(
                    k
                    for k in set(report[what]) | set(first[what])
                    if report[what].get(k) != first[what].get(k)
                )
                raise ShardError(
                    f"{path} and {first_path} ran different {what}s "
                    f"({', '.join(differ)}): only shards of one campaign merge"
                )
    owner: dict[int, Path] = {}
    for path, report in shards:
        for seed in seeds_in(report["seeds"]["ranges"]):
            if seed in owner:
                both = [
                    s for s in seeds_in(report["seeds"]["ranges"]) if owner.get(s) == owner[seed]
                ]
                raise ShardError(
                    f"{path} and {owner[seed]} overlap: seeds {text_of(ranges(both))} are in "
                    "both (a seed must count once)"
                )
            owner[seed] = path
    summary = Summary.from_report(first)
    for _, report in shards[1:]:
        summary.absorb(Summary.from_report(report))
    return summary


# What a shard's checksum leaves out: what differs between two runs of the same seeds.
UNCHECKED: Final = ("wall_seconds", "code")


def checksum(report: dict[str, Any]) -> str:
    """A shard's checksum: sha256 of its findings (every field but ``UNCHECKED``)."""
    found = {k: v for k, v in report.items() if k not in UNCHECKED}
    return hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()


def digest(shards: Sequence[tuple[Path, dict[str, Any]]], merged: dict[str, Any]) -> dict[str, Any]:
    """A campaign's digest: each shard's seeds, commit, figures and checksum, and the merged
    report without its histogram (a few kilobytes where the shards take megabytes)."""
    return {
        "shards": [
            {
                "file": path.name,
                "seeds": text_of(report["seeds"]["ranges"]),
                "code": report["code"],  # each commit that ran some of its seeds
                "messages": report["messages"],
                "lost": report["lost"],
                "early": report["early"],
                "violations": report["violations"],
                "duplicates": report["duplicates"],
                "checksum": checksum(report),
            }
            for path, report in shards
        ],
        "merged": {k: v for k, v in merged.items() if k != "lateness_histogram"},
    }
