"""``python -m sim``: run seeds, check every one, write ``results/sim.json``.

Exit status: 0 when no seed broke a guarantee, 1 otherwise (each failing seed prints the one
command that reproduces it, and the history of the messages that broke).

``python -m sim merge SHARD... --out FILE``: add up the results files of a campaign's chunks
(each run's file is a shard, :mod:`sim.campaign`; ``digest`` instead of ``merge`` writes the
campaign's compact digest); exit status 2 when they cannot be merged
exactly (other shapes or knobs, overlapping seeds).

``python -m sim mutants``: re-introduce fixed defects one at a time and check that seeds catch
each (:mod:`sim.mutants`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from sim.campaign import ShardError, code_version, digest, load, merge, text_of
from sim.faults import Knobs
from sim.run import RunResult, Summary, campaign
from sim.workload import Shape

# Messages a seed's producers write per simulated hour of its window (the default shape's
# rate: 300 in 20 minutes).
RATE_PER_HOUR = 900
# The results file is rewritten every this many seeds.
CHECKPOINT_SEEDS = 25


def seeds_of(text: str) -> list[int]:
    """``7``, ``0-99`` or ``1,5,9-12``."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] in (["merge"], ["digest"]):
        return merge_main(given[1:], digests=given[0] == "digest")
    if given[:1] == ["mutants"]:
        from sim.mutants import main as mutants_main  # noqa: PLC0415

        return mutants_main(given[1:])
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    parser.add_argument("--seeds", default="0-19", help="seeds to run: 7, 0-99 or 1,5,9-12")
    parser.add_argument(
        "--hours",
        type=float,
        default=None,
        help="each seed's producers write for this many simulated hours (default 1/3)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help=f"requests each seed's producers write (default {RATE_PER_HOUR} per simulated hour)",
    )
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--calm", action="store_true", help="no faults (a baseline)")
    parser.add_argument(
        "--limits",
        action="store_true",
        help="tenant limits: release caps, ingest quotas and priorities (sim.workload)",
    )
    parser.add_argument(
        "--no-corners",
        action="store_true",
        help="without the contract's corners (cross-partition ids, same-due reuse, control "
        "chains, near-cutoff controls): the workload of the earlier campaigns",
    )
    parser.add_argument("--out", type=Path, default=Path("results/sim.json"))
    parser.add_argument("--quiet", action="store_true", help="no line per seed")
    args = parser.parse_args(argv)

    shape = Shape()
    if args.hours is not None:
        shape = replace(
            shape,
            window_ms=int(args.hours * 3_600_000),
            messages=max(10, int(args.hours * RATE_PER_HOUR)),
        )
    if args.messages is not None:
        if args.messages < 1:
            parser.error("--messages must be at least 1")
        shape = replace(shape, messages=args.messages)
    if args.limits:
        shape = replace(shape, limits=True)
    if args.no_corners:
        shape = replace(shape, contract=False)
    knobs = Knobs.calm() if args.calm else Knobs()
    seeds = seeds_of(args.seeds)
    summary = Summary(version=code_version())
    print(
        f"simulating {len(seeds)} seeds ({shape.messages} requests each, {args.workers} workers)",
        file=sys.stderr,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for result in campaign(seeds, shape, knobs, args.workers):
        summary.add(result)
        if not args.quiet or not result.ok:
            _progress(result, summary, len(seeds))
        if not result.ok:
            _explain(result, args)
        if len(summary.seeds) % CHECKPOINT_SEEDS == 0:  # a long campaign stopped early still counts
            args.out.write_text(json.dumps(summary.as_dict(shape, knobs), indent=2) + "\n")
    report = summary.as_dict(shape, knobs)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _print_summary(report, args.out)
    return 1 if summary.failing else 0


def merge_main(argv: list[str], *, digests: bool = False) -> int:
    """``python -m sim merge``: one results file (and summary) of a campaign's shards;
    ``python -m sim digest``: the campaign's digest (:func:`sim.campaign.digest`) instead."""
    command = "digest" if digests else "merge"
    parser = argparse.ArgumentParser(
        prog=f"python -m sim {command}",
        description="Merge the results files of a campaign run in chunks (same shape and "
        "knobs, disjoint seeds) into one, exactly"
        + (": write its digest (per shard: seeds, commit, figures, checksum)." if digests else "."),
    )
    parser.add_argument("shards", type=Path, nargs="+", help="results files of the chunks")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help=f"the {'digest' if digests else 'merged results'} file",
    )
    args = parser.parse_args(argv)
    try:
        shards = [
            (path, load(path)) for path in args.shards if path.resolve() != args.out.resolve()
        ]
        summary = merge(shards)
    except ShardError as e:
        print(f"python -m sim merge: {e}", file=sys.stderr)
        return 2
    _, first = shards[0]
    report = summary.as_dict(first["shape"], first["knobs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    written = digest(shards, report) if digests else report
    args.out.write_text(json.dumps(written, indent=2) + "\n")
    print(f"merged {len(shards)} shards")
    _print_summary(report, args.out)
    return 1 if summary.failing else 0


def _progress(result: RunResult, summary: Summary, total: int) -> None:
    v = result.verdict
    state = "ok" if result.ok else "FAILED"
    print(
        f"[{len(summary.seeds)}/{total}] seed {result.seed}: {v.messages} requests, "
        f"{result.simulated_ms / 3_600_000:.1f} h simulated, {sum(result.faults.values())} faults, "
        f"{v.duplicates} duplicates: {state}",
        file=sys.stderr,
    )


def _explain(result: RunResult, args: argparse.Namespace) -> None:
    command = f".venv/bin/python -m sim --seeds {result.seed} --workers 1"
    if args.hours is not None:
        command += f" --hours {args.hours}"
    if args.messages is not None:
        command += f" --messages {args.messages}"
    if args.calm:
        command += " --calm"
    if args.limits:
        command += " --limits"
    print(f"seed {result.seed} broke a guarantee; reproduce with: {command}")
    if result.verdict.unacknowledged:
        print(f"  {result.verdict.unacknowledged} records never acknowledged by ingest")
    for violation in result.verdict.violations[:10]:
        print(
            f"  {violation.kind}: {violation.delay_id} (due {violation.due_ms}): {violation.detail}"
        )
    for delay_id, story in result.stories.items():
        print(f"  history of {delay_id}:")
        for line in story[:30]:
            print(f"    {line}")


def _print_summary(report: dict[str, object], out: Path) -> None:
    lateness = report["lateness_ms"]
    steady = report["lateness_away_from_outages_ms"]
    assert isinstance(lateness, dict)
    assert isinstance(steady, dict)
    faults = report["faults"]
    assert isinstance(faults, dict)
    seeds = report["seeds"]
    assert isinstance(seeds, dict)
    print(
        f"seeds {seeds['count']}, simulated hours {report['simulated_hours']}, "
        f"messages {report['messages']}, faults injected {sum(faults.values())}"
    )
    print("faults by kind: " + ", ".join(f"{k} {v}" for k, v in faults.items()))
    violations = report["violations"]
    assert isinstance(violations, dict)
    others = ", ".join(f"{k} {v}" for k, v in violations.items() if k not in ("lost", "early"))
    print(
        f"lost {report['lost']}, early {report['early']}, duplicates {report['duplicates']}, "
        f"other violations: {others or 'none'}, unacknowledged {report['unacknowledged']}"
    )
    print(
        f"lateness of first deliveries: p50 {lateness['p50']} ms, "
        f"p99 {lateness['p99']} ms, max {lateness['max']} ms; away from the long outages "
        f"({steady['messages']} messages): p50 {steady['p50']} ms, p99 {steady['p99']} ms, "
        f"max {steady['max']} ms"
    )
    limited = report["lateness_limited_from_release_ms"]
    assert isinstance(limited, dict)
    if limited["messages"]:
        print(
            f"capped or deferred tenants' messages ({limited['messages']}), from their release: "
            f"p50 {limited['p50']} ms, p99 {limited['p99']} ms, max {limited['max']} ms"
        )
    coverage = report.get("coverage") or {}
    assert isinstance(coverage, dict)
    print("contract coverage (messages): " + ", ".join(f"{k} {v}" for k, v in coverage.items()))
    code = report["code"]
    assert isinstance(code, list)
    versions = "; ".join(
        f"{text_of(entry['seeds'])} by {str(entry['commit'] or 'unknown code')[:12]}"
        + (" (with uncommitted changes)" if entry["dirty"] else "")
        for entry in code
    )
    print(f"seeds {text_of(seeds['ranges']) or 'none'}; code: {versions or 'none'}")
    print(f"failing seeds: {report['failing_seeds'] or 'none'}; written {out}")


if __name__ == "__main__":
    sys.exit(main())
