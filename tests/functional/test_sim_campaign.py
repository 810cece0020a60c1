"""A campaign run in chunks merges into exactly the results of one run over all its seeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.__main__ import main
from sim.campaign import checksum, code_version

# A small shape: seconds a seed.
ARGS = ["--workers", "1", "--hours", "0.05", "--messages", "37", "--quiet"]


@pytest.fixture(scope="module", params=[[], ["--limits"]], ids=["plain", "limits"])
def shards(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[str, Path]:
    """Seeds 3-5 in one run, and in two chunks (3-4, then 5); as they are and with tenant
    limits (whose capped messages have their own lateness histogram)."""
    folder = tmp_path_factory.mktemp("campaign")
    out: dict[str, Path] = {}
    for name, seeds in (("whole", "3-5"), ("first", "3-4"), ("second", "5")):
        out[name] = folder / f"seeds-{seeds}.json"
        assert main(["--seeds", seeds, *ARGS, *request.param, "--out", str(out[name])]) == 0
    return out


def read(path: Path) -> dict[str, Any]:
    report = json.loads(path.read_text())
    assert isinstance(report, dict)
    return report


def merge(capsys: pytest.CaptureFixture[str], out: Path, *paths: Path) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["merge", *map(str, paths), "--out", str(out)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_the_merged_chunks_are_the_run_over_all_their_seeds(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    merged = tmp_path / "merged.json"
    status, text = merge(capsys, merged, shards["second"], shards["first"])
    assert status == 0
    whole, parts = read(shards["whole"]), read(merged)
    assert whole.pop("wall_seconds") > 0
    assert parts.pop("wall_seconds") > 0
    assert parts == whole  # every count, outcome, histogram and percentile
    # The chunks' percentiles differ from the union's: the merge recomputed them exactly.
    chunks = [read(shards[name])["lateness_ms"] for name in ("first", "second")]
    assert whole["lateness_ms"] not in chunks
    assert whole["seeds"]["ranges"] == [[3, 5]]
    assert whole["lateness_histogram"]["bucket_ms"] == 10
    assert sum(whole["lateness_histogram"]["all"].values()) == whole["lateness_ms"]["messages"]
    limited = whole["lateness_limited_from_release_ms"]
    assert sum(whole["lateness_histogram"]["limited_from_release"].values()) == limited["messages"]
    assert (limited["messages"] > 0) == whole["shape"]["limits"]
    version = code_version()
    assert whole["code"] == [{**version, "seeds": [[3, 5]]}]
    assert "merged 2 shards" in text
    assert "lost 0, early 0" in text
    assert f"seeds 3-5; code: 3-5 by {str(version['commit'] or 'unknown code')[:12]}" in text


def test_a_digest_keeps_each_shards_seeds_commit_figures_and_a_checksum_a_rerun_matches(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "digest.json"
    capsys.readouterr()
    assert main(["digest", str(shards["first"]), str(shards["second"]), "--out", str(out)]) == 0
    found = read(out)
    first, second = found["shards"]
    assert (first["seeds"], second["seeds"]) == ("3-4", "5")
    assert first["code"] == [{**code_version(), "seeds": [[3, 4]]}]
    assert first["messages"] == read(shards["first"])["messages"]
    assert "lateness_histogram" not in found["merged"]
    assert found["merged"]["lateness_ms"] == read(shards["whole"])["lateness_ms"]
    # The same seeds run again on the same code: the same checksum (wall time aside).
    again = tmp_path / "again.json"
    flags = ["--limits"] if read(shards["second"])["shape"]["limits"] else []
    assert main(["--seeds", "5", *ARGS, *flags, "--out", str(again)]) == 0
    assert checksum(read(again)) == second["checksum"]


def test_a_merged_file_merges_again(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.json"
    assert merge(capsys, first, shards["first"])[0] == 0
    again = tmp_path / "again.json"
    assert merge(capsys, again, first, shards["second"])[0] == 0
    merged, whole = read(again), read(shards["whole"])
    assert merged["lateness_ms"] == whole["lateness_ms"]
    assert merged["lateness_away_from_outages_ms"] == whole["lateness_away_from_outages_ms"]
    assert merged["faults"] == whole["faults"]


def test_overlapping_seeds_are_refused(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged.json"
    status, text = merge(capsys, out, shards["whole"], shards["second"])
    assert status == 2
    assert "overlap: seeds 5 are in both" in text
    assert not out.exists()


@pytest.mark.parametrize(
    "change",
    [("shape", "messages", 38), ("knobs", "throttle", 0.0), ("knobs", "latency_ms", [2, 41])],
)
def test_shards_of_another_shape_or_knobs_are_refused(
    shards: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: tuple[str, str, Any],
) -> None:
    what, field, value = change
    other = read(shards["second"])
    other[what][field] = value
    changed = tmp_path / "other.json"
    changed.write_text(json.dumps(other))
    status, text = merge(capsys, tmp_path / "merged.json", shards["first"], changed)
    assert status == 2
    assert f"ran different {what}s ({field})" in text


@pytest.mark.parametrize("key", ["lateness_histogram", "code", "simulated_ms"])
def test_a_results_file_from_before_shards_is_refused(
    shards: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    old = read(shards["second"])
    del old[key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    status, text = merge(capsys, tmp_path / "merged.json", shards["first"], path)
    assert status == 2
    assert f"not a shard (no {key})" in text
