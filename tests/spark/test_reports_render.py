"""Charts and the HTML summary (no Spark needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from delayq_reports import render

PNG = b"\x89PNG\r\n\x1a\n"
MOMENT = datetime(2025, 2, 19, 21, 0, tzinfo=UTC)
DAY_SECONDS = 86_400


def drawn(figure: Figure) -> Axes:
    """The figure's one axes, laid out and drawn (ticks and legend placed), as the PNG is."""
    figure.draw_without_rendering()
    [axes] = figure.axes
    return axes


def x_span(axes: Axes) -> timedelta:
    low, high = axes.get_xlim()  # matplotlib's date unit: days
    return timedelta(days=high - low)


def tick_labels(axes: Axes) -> list[str]:
    return [label.get_text() for label in axes.get_xticklabels() if label.get_text()]


def test_early_deliveries_are_shown_in_red() -> None:
    facts = [("Messages delivered", "3"), ("Early deliveries", "1")]
    page = render.summary_html("r", facts, alerts=["Early deliveries"])

    assert '<tr class="alert"><th>Early deliveries</th><td>1</td></tr>' in page
    assert "<tr><th>Messages delivered</th><td>3</td></tr>" in page
    assert f"tr.alert th,tr.alert td{{color:{render.ALERT_COLOR}" in page
    assert 'class="alert"' not in render.summary_html("r", facts)


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
        render.histogram_chart("t", "ms", [render.Bucket("0", 1.0)], marker=render.Marker(0, "m")),
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


@pytest.mark.parametrize(
    ("series", "step", "span"),
    [
        ({"all": [(MOMENT, 3.0)]}, timedelta(hours=1), timedelta(hours=2)),
        ({"all": [(MOMENT, 3.0)]}, timedelta(minutes=5), timedelta(minutes=10)),
        # several series, every point at the same moment
        (
            {"p50": [(MOMENT, 2.0)], "p99": [(MOMENT, 200.0)]},
            timedelta(hours=1),
            timedelta(hours=2),
        ),
    ],
)
def test_one_moment_spans_a_step_either_side_not_years(
    series: dict[str, list[render.Point]], step: timedelta, span: timedelta
) -> None:
    axes = drawn(render.line_figure("t", "ms", series, step=step, log_y=True))

    # matplotlib alone would span 4 years
    assert abs(x_span(axes) - span) < timedelta(seconds=1)
    low, high = axes.get_xlim()
    assert low < MOMENT.timestamp() / DAY_SECONDS < high
    labels = tick_labels(axes)
    assert len(labels) >= 3
    assert all(":" in label for label in labels), labels  # times of day, not years
    assert axes.get_xlabel() == "UTC"


def test_points_over_time_keep_their_own_range() -> None:
    points = [(MOMENT + timedelta(hours=h), float(h)) for h in range(6)]
    axes = drawn(render.line_figure("t", "n", {"all": points}))

    assert timedelta(hours=5) <= x_span(axes) < timedelta(hours=6)


@pytest.mark.parametrize(
    "figure",
    [
        render.line_figure("t", "ms", {"a": [(MOMENT, 1.0)], "b": [(MOMENT, 2.0)]}),
        render.bar_figure("t", "%", ["x", "y"], {"a": [1.0, 2.0], "b": [3.0, 4.0]}),
        render.histogram_figure("t", "ms", [render.Bucket("0", 5.0)], marker=render.Marker(0, "m")),
    ],
    ids=["line", "bar", "histogram"],
)
def test_legends_are_outside_the_plot_area(figure: Figure) -> None:
    axes = drawn(figure)
    legend = axes.get_legend()

    assert legend is not None
    plot = axes.get_window_extent()
    box = legend.get_window_extent()
    assert box.x0 >= plot.x1  # right of the plot area: it covers no data
    assert box.x1 <= figure.bbox.x1  # and inside the image (constrained layout made room)


def test_histogram_is_log_scaled_with_the_threshold_and_early_bar() -> None:
    buckets = [
        render.Bucket("early", 2.0, alert=True),
        render.Bucket("0", 0.0),
        render.Bucket("<= 10", 5000.0),
        render.Bucket("<= 25", 3.0),
    ]
    figure = render.histogram_figure(
        "h", "ms", buckets, marker=render.Marker(2.5, "p99 alarm: 25 ms")
    )
    axes = drawn(figure)

    assert axes.get_yscale() == "log"
    low, high = axes.get_ylim()
    assert low < 1  # a single message still shows as a bar
    assert high > 5000
    [line] = axes.get_lines()
    assert np.asarray(line.get_xdata(), dtype=float).tolist() == [2.5, 2.5]
    bars = [bar for bar in axes.patches if isinstance(bar, Rectangle)]
    assert [bar.get_height() for bar in bars] == [2.0, 0.0, 5000.0, 3.0]
    assert to_hex(bars[0].get_facecolor()) == render.ALERT_COLOR
    assert to_hex(bars[2].get_facecolor()) == render.BAR_COLOR
    legend = axes.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [
        "messages",
        "early (before due)",
        "p99 alarm: 25 ms",
    ]


def test_histogram_without_early_deliveries_lists_no_early_entry() -> None:
    buckets = [render.Bucket("early", 0.0, alert=True), render.Bucket("0", 7.0)]
    legend = drawn(render.histogram_figure("h", "ms", buckets)).get_legend()

    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["messages"]


def test_empty_histogram_says_no_data() -> None:
    axes = drawn(render.histogram_figure("h", "ms", [render.Bucket("0", 0.0)]))

    assert axes.get_yscale() == "linear"
    assert "no data" in [text.get_text() for text in axes.texts]
