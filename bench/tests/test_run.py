"""`python -m bench --quick` end to end: every section of results/bench.json is there."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.calls import pending_wru
from bench.cost import capped_usd_per_message, placement_wru_per_message, price
from bench.instructions import BASELINE, PAIRS, Count, InstructionSettings
from bench.results import console, write
from bench.run import QUICK, run
from bench.template import deployed


def fake_count(_valgrind: str, pair: str, side: str, _cfg: InstructionSettings) -> Count:
    """A callgrind count without callgrind (bench/tests/test_instructions.py runs the real
    one): the baseline, and 20 messages at 600 (handler) or 200 (floor) instructions each."""
    if side == BASELINE:
        return Count(1_000_000, 0)
    return Count(1_000_000 + 20 * (600 if side == PAIRS[pair][0] else 200), 20)


def test_bench_runs_end_to_end_with_tiny_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bench.instructions.count", fake_count)
    monkeypatch.setattr("bench.instructions.callgrind", lambda: "valgrind")
    monkeypatch.setattr("bench.instructions._version", lambda _valgrind: "valgrind (fake)")
    options = replace(QUICK, out=tmp_path)
    doc = run(options, out=io.StringIO())
    json_path, md_path = write(doc, tmp_path)
    saved = json.loads(json_path.read_text())
    for section, keys in {
        "requests_per_message": ("sqs", "dynamodb_writes_long", "dynamodb_reads_long"),
        "cpu_messages_per_second": ("ingest", "scheduler", "emitter"),
        "lateness_ms": ("p50", "p99", "max", "early"),
        "burst": ("messages", "drain_seconds", "messages_per_second"),
        "cost_usd_per_million": (
            "this_design",
            "explicit_delete",
            "sqs_reenqueue",
            "eventbridge_scheduler",
            "step_functions",
        ),
    }.items():
        for key in keys:
            assert key in saved[section], (section, key)
    assert saved["requests_per_message"]["sqs"] > 0
    pending = saved["requests_per_message"]["pending_counts"]["rows"]
    # A few fixed delays cost less than delays spread over hours and days; bigger batches less.
    by = {(r["mix"].split()[0], r["batch"]): r["wru_per_message"] for r in pending}
    assert 0 < by[("three", 1000)] < by[("three", 100)] < by[("reference", 100)] < 0.1
    # The cost model prices the pending counts of the delay mix in the template's ingest
    # batches, not those of the per-path runs (whose batches fall in one period each).
    details = saved["cost_usd_per_million"]["details"]
    lines = {line["component"]: line for line in details["designs"]["this_design"]["lines"]}
    batch = deployed().ingest_batch_size
    assert lines["DynamoDB pending counts"]["usd_per_million"] == pytest.approx(
        pending_wru(saved["requests_per_message"]["pending_counts"], batch)
        * price("dynamodb_wru")
        * 1e6
    )
    assert f"ingest batches of {batch}" in lines["DynamoDB pending counts"]["detail"]
    off = next(v for v in details["sensitivity"] if v["variant"].startswith("PendingCounts=0"))
    assert off["delta"] == pytest.approx(
        -lines["DynamoDB pending counts"]["usd_per_million"], abs=1e-4
    )
    # The id index: a locator's write unit (on-demand price) and its storage, per message.
    index = next(v for v in details["sensitivity"] if v["variant"].startswith("IdIndex=1"))
    assert price("dynamodb_wru") * 1e6 < index["delta"] < price("dynamodb_wru") * 1e6 * 1.05
    # A strict release cap: placements (each batch touches at most 64 id groups of its due
    # second), slot claims and late-count reads, priced from the items the layer writes.
    capped = next(v for v in details["sensitivity"] if "strict release cap" in v["variant"])
    assert capped["delta"] == pytest.approx(capped_usd_per_message() * 1e6, abs=1e-4)
    assert 64 / 500 <= placement_wru_per_message() <= 64 / 500 + 0.01
    assert saved["cpu_messages_per_second"]["emitter"] > 0
    assert {"ingest", "emitter", "method", "goal", "met"} <= set(saved["cpu_vs_floor"])
    # Instruction counts (callgrind) next to the time ratios, in the JSON and on the console.
    counted = saved["cpu_vs_floor"]["instructions"]
    assert counted["skipped"] == {}
    for name in ("ingest", "emitter"):
        assert {k: counted["per_message"][name][k] for k in ("handler", "floor")} == {
            "handler": 600,
            "floor": 200,
        }
        assert counted[name] == 3.0
        assert f"{name} instructions vs its floor" in console(doc)
    assert (
        saved["cost_usd_per_million"]["step_functions"]
        > saved["cost_usd_per_million"]["eventbridge_scheduler"]
    )
    assert saved["machine"]["cpu_model"]
    aws = saved["fairness"]["aws_scale"]
    assert [g["name"].split(",")[0] for g in aws["goals"]] == [
        "bystander p99",
        "bystander p99",
        "burst p99 after due",
        "burst p99 from its release slot",
    ]
    # Sharing one queue, the bystanders wait out the burst's drain; apart, they do not.
    assert aws["bystander_p99_ms"]["before"] > 60_000
    assert aws["burst_p99_ms"]["capped_from_release"] < aws["burst_p99_ms"]["uncapped_after_due"]
    assert saved["fairness"]["local"] is None  # --quick runs no local stack
    assert "fairness (10 M in AWS)" in console(doc)
    assert "| figure |" in md_path.read_text()
    assert "cost per million" in console(doc)
