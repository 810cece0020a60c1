"""The local fairness run's phase selection (the phases themselves need the local stack)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from bench import fairness
from bench.__main__ import parse
from bench.results import _fairness_rows


def _figures(p99: float) -> dict[str, Any]:
    burst = {
        "lateness_ms": {"p99": 2 * p99},
        "max_per_release_second": 100,
        "max_per_second": 100,
        "cap_respected": True,
        "early": 0,
    }
    return {"bystanders": {"lateness_ms": {"p99": p99}}, "burst": burst}


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The phases measured, in order; each gives a bystander p99 of 1,000 ms before and
    400 ms after."""
    ran: list[str] = []

    def measure(_options: Any, phase: Any, _out: Any) -> dict[str, Any]:
        ran.append(phase.name)
        return _figures({"before": 1000.0, "after": 400.0}[phase.name])

    monkeypatch.setattr(fairness, "_measure_phase", measure)
    monkeypatch.setattr(fairness, "ROOT", tmp_path)
    return ran


def test_the_command_line_selects_the_phases() -> None:
    assert parse(["--fairness-phases", "after"]).fairness.phases == ("after",)
    assert parse([]).fairness.phases == ("before", "after")


def test_only_the_phases_asked_for_run(ran: list[str]) -> None:
    result = fairness.measure_local(fairness.FairnessOptions(phases=("after",)), io.StringIO())
    assert ran == ["after"]
    assert result["bystander_p99_ms"] == {"before": None, "after": 400.0}
    assert result["met"] is True
    rows = _fairness_rows({"local": result})
    assert [r[1] for r in rows] == ["n/a / 400", "n/a / 800; 100 / 100; 0"]


def test_without_the_after_phase_the_goal_is_not_judged(ran: list[str]) -> None:
    result = fairness.measure_local(fairness.FairnessOptions(phases=("before",)), io.StringIO())
    assert ran == ["before"]
    assert result["met"] is None
    assert [r[0] for r in _fairness_rows({"local": result})] == [
        "fairness (local): bystander p99 before / after (ms)"
    ]


def test_both_phases_by_default(ran: list[str]) -> None:
    result = fairness.measure_local(fairness.FairnessOptions(), io.StringIO())
    assert ran == ["before", "after"]
    assert result["bystander_p99_ms"] == {"before": 1000.0, "after": 400.0}
    assert result["met"] is True


def test_an_unknown_phase_is_refused(ran: list[str]) -> None:
    with pytest.raises(ValueError, match="fairness phases"):
        fairness.measure_local(fairness.FairnessOptions(phases=("during",)), io.StringIO())
    assert ran == []
