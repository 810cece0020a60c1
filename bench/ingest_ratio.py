"""``python -m bench.ingest_ratio [--instructions]``: ingest's CPU against its floor, timed
exactly as ``make bench`` times it (``bench.cpu``), and with ``--instructions`` the callgrind
counts of the same pair (``bench.instructions``); printed as JSON, nothing written."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from bench.cpu import CpuSettings, ingest_against_floor
from bench.instructions import measure_instructions


def main(argv: Sequence[str] | None = None) -> None:
    """Time (and count) ingest against its floor; print the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_ratio", description=__doc__)
    parser.add_argument("--repeats", type=int, default=CpuSettings.repeats)
    parser.add_argument("--batches", type=int, default=CpuSettings.ingest_batches)
    parser.add_argument("--instructions", action="store_true", help="also count (callgrind)")
    args = parser.parse_args(argv)
    out = ingest_against_floor(CpuSettings(ingest_batches=args.batches, repeats=args.repeats))
    if args.instructions:
        out["instructions"] = measure_instructions(pairs=("ingest",)).as_dict()
    sys.stdout.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
