"""Charts and the HTML summary (no Spark needed)."""

from __future__ import annotations

from datetime import datetime

from delayq_reports import render

PNG = b"\x89PNG\r\n\x1a\n"


def test_summary_escapes_and_links() -> None:
    page = render.summary_html(
        "Report <1>",
        [("Export", "a&b")],
        tables=[render.TableLinks("t", "csv/t/part-0.csv", "parquet/t/")],
        charts=[render.Link("c", "charts/c.png")],
        links=[render.Link("delivery", "delivery/index.html")],
    )

    assert "<title>Report &lt;1&gt;</title>" in page
    assert "<tr><th>Export</th><td>a&amp;b</td></tr>" in page
    assert '<a href="csv/t/part-0.csv">csv</a>' in page
    assert '<img src="charts/c.png" alt="c">' in page
    assert '<li><a href="delivery/index.html">delivery</a></li>' in page


def test_charts_render_with_and_without_data() -> None:
    moment = datetime(2025, 2, 19, 21, 20)
    charts = [
        render.line_chart("t", "ms", {"a": [(moment, 1.0)], "b": [(moment, 2.0)]}, log_y=True),
        render.line_chart("t", "ms", {"all": [(moment, 3.0)]}, mark=(moment, 3.0)),
        render.line_chart("t", "ms", {}),
        render.bar_chart("t", "%", ["x", "y"], {"a": [1.0, 2.0], "b": [3.0, 4.0]}),
        render.bar_chart("t", "n", ["x"], {"a": [1.0], "b": [2.0]}, stacked=True),
        render.bar_chart("t", "n", [], {}),
    ]
    assert all(png.startswith(PNG) for png in charts)


def test_formats() -> None:
    assert render.format_ms(1_740_000_000_123) == "2025-02-19 21:20:00.123 UTC"
    assert render.format_ms(None) == "—"
    assert render.format_share(0.98765) == "98.77 %"
    assert render.format_share(None) == "—"
    assert render.format_time(None) == "—"
    local = datetime.fromtimestamp(1_740_000_000)  # naive local time, as PySpark returns it
    assert render.format_time(local) == "2025-02-19 21:20:00 UTC"
