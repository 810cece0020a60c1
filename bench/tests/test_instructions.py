"""Instruction counts under callgrind: the arithmetic, the output parsing, a real count."""

from __future__ import annotations

import pytest

from bench.instructions import (
    Count,
    InstructionSettings,
    main,
    measure_instructions,
    parse_totals,
    per_message,
    summary,
)

TINY = InstructionSettings(ingest_batches=1, ingest_batch_size=10, runs=1)


def test_totals_are_read_from_the_summary_line() -> None:
    text = "version: 1\ncmd: python\nevents: Ir\nfl=(1) x.c\n0 12\nsummary: 123456789\n"
    assert parse_totals(text) == 123_456_789


def test_totals_are_read_from_the_totals_line_of_a_dump() -> None:
    assert parse_totals("events: Ir\ntotals: 42\n") == 42


def test_output_without_totals_is_an_error() -> None:
    with pytest.raises(ValueError, match="no summary or totals"):
        parse_totals("events: Ir\n")


def test_per_message_counts_only_what_the_runs_added_to_the_baseline() -> None:
    assert per_message(Count(1_000_000 + 20 * 500, 20), Count(1_000_000, 0)) == 500


def test_runs_that_processed_nothing_cannot_be_divided() -> None:
    with pytest.raises(ValueError, match="no message"):
        per_message(Count(5, 0), Count(1, 0))


def test_without_valgrind_the_ratios_are_missing_and_say_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("bench.instructions.shutil.which", lambda _name: None)
    result = measure_instructions(TINY, ("ingest", "emitter"))
    assert result.ratios == {"ingest": None, "emitter": None}
    assert "valgrind is not installed" in result.skipped["ingest"]
    assert "valgrind is not installed" in summary(result)
    assert result.as_dict()["ingest"] is None


def test_callgrind_counts_the_ingest_handler_above_its_floor() -> None:
    result = measure_instructions(TINY, ("ingest",))
    per = result.per_message["ingest"]
    # The handler decodes, deflates and serialises what the floor does, and validates, routes
    # and keeps counts too; the floor without deflating does less than the floor.
    assert per["handler"] > per["floor"] > per["floor_without_deflate"] > 10_000
    assert result.ratios["ingest"] == pytest.approx(per["handler"] / per["floor"], rel=0.01)
    assert result.ratios["ingest_vs_floor_without_deflate"] == pytest.approx(
        per["handler"] / per["floor_without_deflate"], rel=0.01
    )
    assert result.messages_per_run["ingest"] == {
        "handler": 10,
        "floor": 10,
        "floor_without_deflate": 10,
    }
    assert result.tool.startswith("valgrind")
    saved = result.as_dict()
    assert saved["ingest"] == round(per["handler"] / per["floor"], 2)
    assert "callgrind" in saved["method"]
    assert summary(result) == (
        f"ingest {result.ratios['ingest']:.2f}x, ingest_vs_floor_without_deflate "
        f"{result.ratios['ingest_vs_floor_without_deflate']:.2f}x"
    )


def test_the_child_refuses_a_side_its_pair_does_not_have() -> None:
    with pytest.raises(SystemExit):
        main(["emitter", "floor_without_deflate"])
