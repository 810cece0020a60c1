"""The report pages in headless Chromium: every chart loads and none is empty or degenerate,
even where a series has a single point; early deliveries show red. The checker itself is
tested on broken pages and empty charts, so that it can fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image
from pyspark.sql import SparkSession

from delayq_reports import render
from delayq_reports.local_spark import LocalReports, run_reports
from delayq_reports.synthetic_exports import message_item, watermark_item, write_export
from tests.spark import pages
from tests.spark.conftest import DAY, HOUR, MINUTE, NOW, delivered
from tests.spark.pages import chart_problems, load

# rgb() of render.ALERT_COLOR, as getComputedStyle gives it.
ALERT_RGB = "rgb({}, {}, {})".format(*(int(render.ALERT_COLOR[i : i + 2], 16) for i in (1, 3, 5)))


def export_with_one_hour_of_deliveries(directory: Path) -> Path:
    """Deliveries within one hour (one point per hourly series), one of them early; messages
    pending over the next three days."""
    at = NOW - 40 * MINUTE
    items = [
        *delivered(
            *(("orders", at + i * MINUTE, at + i * MINUTE + 30 * i) for i in range(10)),
            ("alerts", at, at + 1500),
            ("alerts", at + MINUTE, at + MINUTE - 20),  # early
        ),
        *(
            message_item(f"m{i}", due_ms=NOW + i * 7 * HOUR, target="orders", shard=i % 3)
            for i in range(1, 11)
        ),
        *(message_item(f"b{i}", due_ms=NOW + DAY, target="alerts", shard=i) for i in range(4)),
        watermark_item(NOW // 1000 - 60),
    ]
    return write_export(directory, items, export_time_ms=NOW)


@pytest.fixture(scope="module")
def reports(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> LocalReports:
    base = tmp_path_factory.mktemp("pages")
    export_with_one_hour_of_deliveries(base / "export")
    return run_reports(str(base / "export"), str(base / "out"), spark=spark)


@pytest.mark.spark
@pytest.mark.parametrize("report", ["delivery", "backlog"])
def test_every_chart_loads_in_chromium_and_shows_data(reports: LocalReports, report: str) -> None:
    result = reports.delivery if report == "delivery" else reports.backlog
    index = Path(result.index)

    page = load(index)

    charts = [Path(path) for path in result.charts]
    assert [index.parent / image.src for image in page.images] == charts
    for image, chart in zip(page.images, charts, strict=True):
        with Image.open(chart) as png:
            assert (image.natural_width, image.natural_height) == png.size, image.src
        assert image.shown_width > 0, image.src
    assert [problem for chart in charts for problem in chart_problems(chart)] == []


@pytest.mark.spark
def test_the_early_count_shows_red(reports: LocalReports) -> None:
    assert reports.delivery.alerts == ("Early deliveries",)

    page = load(Path(reports.delivery.index))

    assert [(alert.text.split("\t"), alert.color) for alert in page.alerts] == [
        (["Early deliveries", "1"], ALERT_RGB)
    ]
    assert load(Path(reports.backlog.index)).alerts == ()


@pytest.mark.spark
def test_the_index_links_both_pages(reports: LocalReports) -> None:
    page = load(Path(reports.index))
    hrefs = re.findall(r'href="([^"]+)"', Path(reports.index).read_text())

    assert page.title == "Kafka delay queue reports"
    assert hrefs == ["delivery/index.html", "backlog/index.html"]


def test_a_missing_chart_is_reported_unloaded(tmp_path: Path) -> None:
    (tmp_path / "good.png").write_bytes(render.bar_chart("t", "n", ["x"], {"a": [1.0]}))
    page = tmp_path / "index.html"
    page.write_text(
        render.summary_html("p", [], charts=[render.Link(n, f"{n}.png") for n in ("good", "gone")])
    )

    images = load(page).images

    assert [(i.src, i.natural_width > 0) for i in images] == [
        ("good.png", True),
        ("gone.png", False),
    ]


def test_without_chromium_the_page_tests_fail_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "CHROMIUM", tmp_path / "no-chromium")

    with pytest.raises(pytest.fail.Exception, match="apt-get install -y --no-install-recommends"):
        pages.load(tmp_path / "index.html")


def test_empty_and_blank_charts_are_degenerate(tmp_path: Path) -> None:
    charts = {
        "empty_line.png": render.line_chart("t", "ms", {}),
        "empty_bars.png": render.bar_chart("t", "n", [], {}),
        "empty_histogram.png": render.histogram_chart(
            "t", "ms", [render.Bucket("0", 0.0)], marker=render.Marker(0, "alarm")
        ),
    }
    for name, png in charts.items():
        (tmp_path / name).write_bytes(png)
    Image.new("RGB", (400, 300), "white").save(tmp_path / "blank.png")

    assert {path.name: chart_problems(path) for path in sorted(tmp_path.iterdir())} == {
        "blank.png": ["blank.png: blank (a single colour)"],
        "empty_bars.png": ["empty_bars.png: no data drawn in the plot area (0 data pixels)"],
        "empty_histogram.png": [
            "empty_histogram.png: no data drawn in the plot area (0 data pixels)"
        ],
        "empty_line.png": ["empty_line.png: no data drawn in the plot area (0 data pixels)"],
    }
