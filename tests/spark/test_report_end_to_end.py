"""`delayq report` end to end: the local stack delivers, the table is exported like AWS does,
and both Spark jobs report on the export: the deliveries, and the requests left pending, on
pages that headless Chromium shows with every chart drawn."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from delayq_local.demo import DemoOptions, run_demo
from delayq_local.demo_plan import DEFAULT_TARGETS
from delayq_local.stack import StackConfig, TimeCompression
from tests.integration.support import PROJECT_ROOT
from tests.spark.pages import chart_problems, load

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
PENDING = 12


def rows(folder: Path) -> list[dict[str, str]]:
    [part] = folder.glob("*.csv")
    return list(csv.DictReader(part.open()))


def test_deliveries_are_exported_and_reported(tmp_path: Path) -> None:
    config = StackConfig(
        project_root=PROJECT_ROOT,
        stack_name="delayq-report-e2e",
        parameters={"AllowedTargets": "demo.*"},
        topics=DEFAULT_TARGETS,
        environment={"LOG_LEVEL": "ERROR"},
        time=TimeCompression(horizon_seconds=20, lookahead_seconds=15, tick_seconds=2),
        concurrency={"EmitterFunction": 2},
    )
    options = DemoOptions(
        messages=60,
        max_delay_seconds=30,
        send_seconds=0,
        results=tmp_path,
        timeout_seconds=90,
        reports=tmp_path,
        pending=PENDING,
    )
    report = run_demo(config, options, out=io.StringIO())
    assert report.ok
    assert report.extra["reports"] == str(tmp_path / "index.html")
    assert (tmp_path / "demo.json").is_file()  # the run's own summary, next to the reports
    [overall] = rows(tmp_path / "delivery" / "csv" / "lateness_overall")
    # Every delivery reached the statistics and the export (cancelled and rejected did not).
    assert int(overall["messages"]) == report.delivered
    assert int(overall["early"]) == 0
    # The requests due hours to days ahead are the backlog: pending, due within the 7 days.
    backlog = rows(tmp_path / "backlog" / "csv" / "backlog_by_topic")
    assert sum(int(row["pending"]) for row in backlog) == PENDING
    assert sum(int(row["due_in_window"]) for row in backlog) == PENDING
    hourly = rows(tmp_path / "backlog" / "csv" / "forecast_hour")
    assert sum(int(row["messages"]) for row in hourly) == PENDING
    for page in ("delivery", "backlog"):
        index = tmp_path / page / "index.html"
        charts = sorted((tmp_path / page / "charts").glob("*.png"))
        images = load(index).images
        assert len(images) == len(charts) >= 3, page
        assert [i.src for i in images if i.natural_width == 0] == [], page
        assert [problem for chart in charts for problem in chart_problems(chart)] == [], page
