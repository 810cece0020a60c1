"""`python -m sim mutants` end to end: a planted regression runs in its scratch copy (not the
checkout's code) and the simulator's rules catch it."""

from __future__ import annotations

from sim.mutants import CATALOGUE, hunt


def test_a_mutant_runs_in_its_copy_and_is_caught_by_the_rule_it_breaks() -> None:
    early = next(m for m in CATALOGUE if m.name == "produce-early")
    found = hunt(early, seeds=[])

    assert (found.caught, found.seed, found.seeds_run) == (True, early.seeds[0], 1)
    assert found.rules.get("early", 0) > 0
