"""``python -m bench``: run the benchmarks, print the table, write results/bench.{json,md}.

Benchmarks print figures; the exit status is 0 whatever the figures are (it is non-zero only
when a benchmark itself breaks).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from bench.results import console, write
from bench.run import QUICK, Options, run


def parse(argv: list[str] | None = None) -> Options:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny inputs (smoke test)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="default: results")
    parser.add_argument(
        "--local",
        choices=("auto", "yes", "no"),
        default=None,
        help="the embedded local stack measurements (default: auto; --quick: no)",
    )
    parser.add_argument("--burst", type=int, default=None, help="local burst size (default: 20000)")
    parser.add_argument(
        "--fairness",
        choices=("auto", "yes", "no"),
        default=None,
        help="the local fairness run (default: auto; --quick: no)",
    )
    parser.add_argument(
        "--fairness-burst", type=int, default=None, help="its burst size (default: 20000)"
    )
    parser.add_argument(
        "--fairness-cap", type=int, default=None, help="the burst tenant's cap (default: 100/s)"
    )
    parser.add_argument(
        "--fairness-phases",
        default=None,
        help="its phases, comma-separated (default: before,after)",
    )
    parser.add_argument("--steady-rate", type=float, default=None, help="messages/s locally")
    parser.add_argument("--steady-seconds", type=float, default=None, help="default: 60")
    parser.add_argument("--repeats", type=int, default=None, help="timed CPU runs (7)")
    parser.add_argument(
        "--profile", choices=("auto", "always", "never"), default=None, help="cProfile handlers"
    )
    args = parser.parse_args(argv)
    options = QUICK if args.quick else Options()
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    options = replace(options, out=args.out, command=command.strip())
    local = options.local
    if args.local is not None:
        local = replace(local, enabled=args.local)
    if args.burst is not None:
        local = replace(local, burst_messages=args.burst)
    if args.steady_rate is not None:
        local = replace(local, steady_rate=args.steady_rate)
    if args.steady_seconds is not None:
        local = replace(local, steady_seconds=args.steady_seconds)
    options = replace(options, local=local)
    fairness = options.fairness
    if args.fairness is not None:
        fairness = replace(fairness, enabled=args.fairness)
    if args.fairness_burst is not None:
        fairness = replace(fairness, burst_messages=args.fairness_burst)
    if args.fairness_cap is not None:
        fairness = replace(fairness, release_per_second=args.fairness_cap)
    if args.fairness_phases is not None:
        fairness = replace(fairness, phases=tuple(args.fairness_phases.split(",")))
    options = replace(options, fairness=fairness)
    if args.repeats is not None:
        options = replace(options, cpu=replace(options.cpu, repeats=args.repeats))
    if args.profile is not None:
        options = replace(options, profile=args.profile)
    return options


def main(argv: list[str] | None = None) -> int:
    """Run, print, write."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = parse(argv)
    doc = run(options)
    json_path, md_path = write(doc, options.out)
    sys.stdout.write(console(doc))
    sys.stdout.write(f"\nwrote {json_path} and {md_path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
