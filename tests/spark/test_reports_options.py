"""Job options from Glue-style argv and from dicts (no Spark needed)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from delayq_reports.exceptions import OptionsError
from delayq_reports.options import (
    BacklogForecastOptions,
    DeliveryReportOptions,
    resolve_options,
)

GLUE_ARGV = [
    "script.py",
    "--JOB_NAME",
    "DeliveryReportJob",
    "--export_path",
    "s3://analytics/exports",
    "--output_path=s3://analytics/reports",
    "--job-bookmark-option",
    "job-bookmark-disable",
    "--enable-metrics",
]


class TestResolveOptions:
    def test_pairs_and_equals_forms_other_arguments_ignored(self) -> None:
        assert resolve_options(GLUE_ARGV, ["export_path", "output_path"]) == {
            "export_path": "s3://analytics/exports",
            "output_path": "s3://analytics/reports",
        }

    def test_missing_names_fail(self) -> None:
        with pytest.raises(OptionsError, match="missing job arguments: --now_ms, --days"):
            resolve_options(GLUE_ARGV, ["export_path", "now_ms", "days"])

    @pytest.mark.parametrize("argv", [["s", "--days"], ["s", "--days", "--now_ms", "1"]])
    def test_a_wanted_flag_without_value_fails(self, argv: list[str]) -> None:
        with pytest.raises(OptionsError, match="--days needs a value"):
            resolve_options(argv, ["days"])

    def test_a_valueless_flag_does_not_swallow_the_next_argument(self) -> None:
        argv = ["s", "--enable-metrics", "--days", "3", "stray"]
        assert resolve_options(argv, ["days"]) == {"days": "3"}


class TestFromArgv:
    def test_defaults_when_optional_arguments_are_absent(self) -> None:
        requested: list[list[str]] = []

        def glue_resolver(argv: list[str], names: list[str]) -> Mapping[str, str]:
            requested.append(names)
            return resolve_options(argv, names)

        options = DeliveryReportOptions.from_argv(GLUE_ARGV, glue_resolver)

        assert options == DeliveryReportOptions(
            "s3://analytics/exports", "s3://analytics/reports", now_ms=None, days=7
        )
        # getResolvedOptions fails on absent names: optional ones are only asked for when given.
        assert requested == [["export_path", "output_path"]]

    def test_optional_arguments_are_parsed(self) -> None:
        argv = [*GLUE_ARGV, "--now_ms", "1740000000000", "--days=2", "--top_cohorts", "5"]
        assert BacklogForecastOptions.from_argv(argv) == BacklogForecastOptions(
            "s3://analytics/exports",
            "s3://analytics/reports",
            now_ms=1_740_000_000_000,
            days=2,
            top_cohorts=5,
        )

    def test_the_lateness_alarm_threshold_is_a_delivery_option(self) -> None:
        argv = [*GLUE_ARGV, "--lateness_p99_alarm_ms", "2500"]
        assert DeliveryReportOptions.from_argv(argv).lateness_p99_alarm_ms == 2500
        assert DeliveryReportOptions.from_argv(GLUE_ARGV).lateness_p99_alarm_ms == 1000

    def test_a_bad_number_fails(self) -> None:
        with pytest.raises(OptionsError, match="days='two' is not an integer"):
            DeliveryReportOptions.from_argv([*GLUE_ARGV, "--days", "two"])


class TestFromOptions:
    def test_values_may_be_typed_unknown_keys_and_empty_strings_ignored(self) -> None:
        options = BacklogForecastOptions.from_options(
            {"export_path": "/x", "output_path": "/y", "now_ms": 5, "days": "", "JOB_NAME": "j"}
        )
        assert options == BacklogForecastOptions("/x", "/y", now_ms=5, days=7, top_cohorts=20)

    def test_a_missing_required_option_fails(self) -> None:
        with pytest.raises(OptionsError, match="missing option: output_path"):
            DeliveryReportOptions.from_options({"export_path": "/x"})

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"export_path": ""}, "export_path must not be empty"),
            ({"now_ms": -1}, "now_ms must be >= 0"),
            ({"days": 0}, "days must be >= 1"),
            ({"top_cohorts": 0}, "top_cohorts must be >= 1"),
        ],
    )
    def test_invalid_values_fail(self, kwargs: dict[str, object], message: str) -> None:
        values: dict[str, object] = {"export_path": "/x", "output_path": "/y", **kwargs}
        with pytest.raises(OptionsError, match=message):
            BacklogForecastOptions(**values)  # type: ignore[arg-type]

    def test_the_lateness_alarm_threshold_is_checked(self) -> None:
        with pytest.raises(OptionsError, match="lateness_p99_alarm_ms must be >= 1"):
            DeliveryReportOptions("/x", "/y", lateness_p99_alarm_ms=0)

    def test_delivery_days_are_checked(self) -> None:
        with pytest.raises(OptionsError, match="days must be >= 1"):
            DeliveryReportOptions("/x", "/y", days=0)
