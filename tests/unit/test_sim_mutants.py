"""The mutation check's catalogue and plumbing (``python -m sim mutants``): every mutant still
names code the checkout has, is planted in a scratch copy only, and is judged by the rules the
simulator's results file says were broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.mutants import CATALOGUE, REPO, Hunt, Mutant, find_once, main, plant, rules_of, table


def test_the_catalogue_holds_at_least_fifteen_distinct_regressions() -> None:
    names = [m.name for m in CATALOGUE]
    assert len(names) >= 15
    assert len(set(names)) == len(names)
    assert all(m.old != m.new for m in CATALOGUE)


@pytest.mark.parametrize("mutant", CATALOGUE, ids=lambda m: m.name)
def test_each_mutant_names_code_the_checkout_holds_exactly_once(mutant: Mutant) -> None:
    find_once((REPO / mutant.path).read_text(), mutant)


def test_a_stale_mutant_is_refused() -> None:
    stale = Mutant("stale", "gone", "layers/delayq/delayq/buckets.py", "no such code", "x")
    with pytest.raises(ValueError, match="0 time"):
        find_once((REPO / stale.path).read_text(), stale)


def test_a_mutant_is_planted_in_the_copy_and_nowhere_else(tmp_path: Path) -> None:
    mutant = next(m for m in CATALOGUE if m.name == "cap-one-over")
    root = plant(mutant, tmp_path)

    planted = (root / mutant.path).read_text()
    assert mutant.new in planted
    assert mutant.old not in planted
    assert mutant.old in (REPO / mutant.path).read_text()  # the checkout is untouched
    other = "layers/delayq/delayq/ordering.py"
    assert (root / other).read_text() == (REPO / other).read_text()
    assert (root / "template.yaml").exists()
    assert (root / "sim" / "checker.py").exists()


def test_the_broken_rules_are_read_from_a_results_file() -> None:
    report = {"violations": {"cancel": 3, "cap": 0}, "lost": 2, "early": 0, "unacknowledged": 1}
    assert rules_of(report) == {"cancel": 3, "lost": 2, "unacknowledged": 1}
    assert rules_of({"violations": {}, "lost": 0, "early": 0, "unacknowledged": 0}) == {}


def test_an_unknown_mutant_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "no-such-mutant"])
    assert exit_.value.code == 2
    assert "unknown mutants: no-such-mutant" in capsys.readouterr().err


def test_the_hunts_print_as_a_table_that_names_survivors() -> None:
    caught = Hunt("a", "one", caught=True, seed=3, limits=True, rules={"cap": 2, "lost": 1})
    plain = Hunt("c", "three", caught=True, seed=35, corners=False, rules={"cancel": 1})
    rows = table([caught, Hunt("b", "two"), plain])
    assert rows[2] == "| `a` | one | `cap` 2, `lost` 1 | 3 `--limits` |"
    assert rows[3] == "| `b` | two | **survived** | none of 0-15 |"
    assert rows[4] == "| `c` | three | `cancel` 1 | 35 `--no-corners` |"
