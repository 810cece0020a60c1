"""Shards of a campaign: seed ranges, exact lateness histograms, the code that ran them."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

from sim.campaign import code_version, text_of
from sim.run import Summary, histogram_json, histogram_of, ranges, seeds_in


def test_seeds_are_kept_as_ranges() -> None:
    seeds = [7, 0, 1, 2, 9, 8, 12]
    assert ranges(seeds) == [[0, 2], [7, 9], [12, 12]]
    assert seeds_in(ranges(seeds)) == sorted(seeds)
    assert text_of(ranges(seeds)) == "0-2,7-9,12"
    assert ranges([]) == []


def test_a_lateness_histogram_round_trips_exactly() -> None:
    histogram = Counter({0: 812, 1: 30, 16: 2, 282_000: 1})
    data = histogram_json(histogram)
    assert data == {"0": 812, "10": 30, "160": 2, "2820000": 1}  # each bucket's lower bound
    assert histogram_of(data) == histogram
    assert Summary.lateness_of(histogram_of(data))["max"] == 2_820_000


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(  # noqa: S603 -- git, fixed arguments, a temporary repository
        ["git", "-C", str(repo), *args],  # noqa: S607
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def test_the_code_is_the_commit_and_whether_tracked_files_changed(tmp_path: Path) -> None:
    assert code_version(tmp_path) == {"commit": None, "dirty": None}  # not a checkout
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("one\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    (tmp_path / "results.json").write_text("{}")  # untracked output: still the same code
    assert code_version(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("two\n")
    assert code_version(tmp_path) == {"commit": head, "dirty": True}
