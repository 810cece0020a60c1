"""`delayq report` end to end: the local stack delivers, the table is exported like AWS does,
and both Spark jobs report on the export."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from delayq_local.demo import DemoOptions, run_demo
from delayq_local.demo_plan import DEFAULT_TARGETS
from delayq_local.stack import StackConfig, TimeCompression
from tests.integration.support import PROJECT_ROOT

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]


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
        reports=tmp_path / "reports",
    )
    report = run_demo(config, options, out=io.StringIO())
    assert report.ok
    assert (tmp_path / "reports" / "index.html").is_file()
    [overall] = rows(tmp_path / "reports" / "delivery" / "csv" / "lateness_overall")
    # Every delivery reached the statistics and the export (cancelled and rejected did not).
    assert int(overall["messages"]) == report.delivered
    assert int(overall["early"]) == 0
