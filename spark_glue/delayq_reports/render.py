"""Charts (PNG bytes, matplotlib without pyplot) and the HTML summaries, from collected rows.

Everything here works on small, already aggregated data on the driver; nothing touches Spark.
Times arrive as PySpark gives them (naive datetimes in the driver's local zone) and are shown
in UTC. Each chart has a ``*_figure`` function that builds the matplotlib `Figure` (which a
test can inspect) and a ``*_chart`` function that encodes it as PNG. Legends sit outside the
plot area (right of it), so they never cover data; a time axis with a single moment spans
`step` either side of it instead of matplotlib's default of years.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from io import BytesIO
from typing import Final

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

Point = tuple[datetime, float]

# Early deliveries break an invariant: they are drawn and listed in this colour.
ALERT_COLOR: Final = "#d62728"
BAR_COLOR: Final = "#1f77b4"
THRESHOLD_COLOR: Final = "black"  # not a data colour: chart checks tell it from data


@dataclass(frozen=True)
class Link:
    """A labelled relative link."""

    label: str
    href: str


@dataclass(frozen=True)
class Bucket:
    """One bar of a histogram: its label, its count, and whether it is an alert (drawn red)."""

    label: str
    count: float
    alert: bool = False


@dataclass(frozen=True)
class Marker:
    """A vertical line on a category axis at `position` (0 is the first bar's centre)."""

    position: float
    label: str


@dataclass(frozen=True)
class TableLinks:
    """One output table: its CSV file and Parquet directory, relative to the summary."""

    name: str
    csv: str
    parquet: str


def utc(moment: datetime) -> datetime:
    """A PySpark timestamp (naive, driver-local) as an aware UTC datetime."""
    return moment.astimezone(UTC)


def format_time(moment: datetime | None) -> str:
    """``2025-02-25 10:05:00 UTC``, or an em dash for none."""
    return "—" if moment is None else utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_ms(epoch_ms: int | None) -> str:
    """An epoch-millisecond time as `format_time` shows it."""
    if epoch_ms is None:
        return "—"
    return (
        datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    )


def format_share(share: float | None) -> str:
    """A 0..1 share as a percentage with two decimals."""
    return "—" if share is None else f"{share * 100:.2f} %"


def line_chart(
    title: str,
    ylabel: str,
    series: Mapping[str, Sequence[Point]],
    *,
    mark: Point | None = None,
    log_y: bool = False,
    step: timedelta = timedelta(hours=1),
) -> bytes:
    """`line_figure` as PNG."""
    return png(line_figure(title, ylabel, series, mark=mark, log_y=log_y, step=step))


def line_figure(
    title: str,
    ylabel: str,
    series: Mapping[str, Sequence[Point]],
    *,
    mark: Point | None = None,
    log_y: bool = False,
    step: timedelta = timedelta(hours=1),
) -> Figure:
    """One line per series over time; `mark` highlights one point (such as the peak).

    `step` is the data's own spacing (an hour for hourly figures): when every point falls on
    one moment, the axis spans one step either side of it.
    """
    figure, axes = _figure(title, ylabel)
    moments: list[float] = []
    values: list[float] = []
    for label, points in sorted(series.items()):
        ordered = sorted(points)
        xs = [_date_number(x) for x, _ in ordered]
        moments.extend(xs)
        values.extend(y for _, y in ordered)
        axes.plot(xs, [y for _, y in ordered], label=label, marker="o", markersize=4)
    if mark is not None:
        axes.annotate(
            f"peak {mark[1]:,.0f}",
            (_date_number(mark[0]), mark[1]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    if not moments:
        axes.set_xticks([])
        _no_data(axes)
        return figure
    _date_axis(axes)
    if min(moments) == max(moments):
        half = step.total_seconds() / 86400
        axes.set_xlim(moments[0] - half, moments[0] + half)
    if log_y:
        axes.set_yscale("symlog", linthresh=10)
        # Room beyond the extremes (0 stays off the bottom spine).
        axes.set_ylim(min(0.0, 1.5 * min(values)) - 2, max(10.0, 1.5 * max(values)))
    if len(series) > 1:
        _legend_outside(axes)
    return figure


def bar_chart(
    title: str,
    ylabel: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    stacked: bool = False,
) -> bytes:
    """`bar_figure` as PNG."""
    return png(bar_figure(title, ylabel, categories, series, stacked=stacked))


def bar_figure(
    title: str,
    ylabel: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    stacked: bool = False,
) -> Figure:
    """Bars per category, one colour per series, grouped side by side or stacked."""
    figure, axes = _figure(title, ylabel)
    positions = list(range(len(categories)))
    count = max(len(series), 1)
    width = 0.8 if stacked else 0.8 / count
    bottoms = [0.0] * len(categories)
    for index, (label, values) in enumerate(series.items()):
        if stacked:
            axes.bar(positions, values, width, bottom=bottoms, label=label)
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        else:
            offset = (index - (count - 1) / 2) * width
            axes.bar([p + offset for p in positions], values, width, label=label)
    axes.set_xticks(positions, list(categories), rotation=30, ha="right", fontsize="small")
    if not categories:
        _no_data(axes)
    elif len(series) > 1:
        _legend_outside(axes)
    return figure


def histogram_chart(
    title: str, xlabel: str, buckets: Sequence[Bucket], *, marker: Marker | None = None
) -> bytes:
    """`histogram_figure` as PNG."""
    return png(histogram_figure(title, xlabel, buckets, marker=marker))


def histogram_figure(
    title: str, xlabel: str, buckets: Sequence[Bucket], *, marker: Marker | None = None
) -> Figure:
    """One bar per bucket on a log count axis; alert buckets in red; `marker` as a dashed
    vertical line (such as an alarm threshold). Empty buckets have no bar."""
    figure, axes = _figure(title, "messages (log scale)")
    axes.set_xlabel(xlabel)
    positions = list(range(len(buckets)))
    axes.bar(
        positions,
        [b.count for b in buckets],
        0.8,
        color=[ALERT_COLOR if b.alert else BAR_COLOR for b in buckets],
    )
    axes.set_xticks(positions, [b.label for b in buckets], rotation=30, ha="right")
    handles: list[Artist] = [Patch(color=BAR_COLOR, label="messages")]
    if any(b.alert and b.count > 0 for b in buckets):
        handles.append(Patch(color=ALERT_COLOR, label="early (before due)"))
    if marker is not None:
        axes.axvline(marker.position, color=THRESHOLD_COLOR, linestyle="--", linewidth=2)
        axes.annotate(
            marker.label,
            (marker.position, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-4, -6),
            textcoords="offset points",
            rotation=90,
            ha="right",
            va="top",
            color=THRESHOLD_COLOR,
            fontsize="small",
        )
        handles.append(Line2D([], [], color=THRESHOLD_COLOR, linestyle="--", label=marker.label))
    if not any(b.count > 0 for b in buckets):
        _no_data(axes)
    else:
        axes.set_yscale("log")
        # Down to 0.5, so that a single message is a visible bar; counts as plain numbers.
        axes.set_ylim(0.5, max(10.0, 2 * max(b.count for b in buckets)))
        axes.yaxis.set_major_formatter(FuncFormatter(_count))
        axes.yaxis.set_minor_formatter(NullFormatter())
    _legend_outside(axes, handles)
    return figure


def summary_html(
    title: str,
    facts: Sequence[tuple[str, str]],
    tables: Sequence[TableLinks] = (),
    charts: Sequence[Link] = (),
    links: Sequence[Link] = (),
    *,
    alerts: Collection[str] = (),
) -> str:
    """A self-contained HTML page: key figures, links to reports or tables, embedded charts.

    The facts named in `alerts` (such as a non-zero early count) are shown in red, bold.
    """
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;"
        "text-align:left}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
        f"tr.alert th,tr.alert td{{color:{ALERT_COLOR};font-weight:bold}}</style>",
        "</head><body>",
        f"<h1>{_e(title)}</h1>",
    ]
    if facts:
        parts.append("<table>")
        parts.extend(
            f"<tr{_ALERT_ROW if k in alerts else ''}><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
            for k, v in facts
        )
        parts.append("</table>")
    if links:
        parts.append("<ul>")
        parts.extend(f'<li><a href="{_e(x.href)}">{_e(x.label)}</a></li>' for x in links)
        parts.append("</ul>")
    if tables:
        parts.append("<h2>Tables</h2><table><tr><th>table</th><th>CSV</th><th>Parquet</th></tr>")
        parts.extend(
            f'<tr><td>{_e(t.name)}</td><td><a href="{_e(t.csv)}">csv</a></td>'
            f'<td><a href="{_e(t.parquet)}">parquet</a></td></tr>'
            for t in tables
        )
        parts.append("</table>")
    if charts:
        parts.append("<h2>Charts</h2>")
        parts.extend(
            f'<h3>{_e(c.label)}</h3><a href="{_e(c.href)}"><img src="{_e(c.href)}" '
            f'alt="{_e(c.label)}"></a>'
            for c in charts
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _figure(title: str, ylabel: str) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(10, 4.5), dpi=100, layout="constrained")
    axes = figure.subplots()
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.grid(visible=True, alpha=0.3)
    return figure, axes


def _date_axis(axes: Axes) -> None:
    """UTC dates on the x axis, labelled concisely (the day once, then the times)."""
    axes.xaxis_date(UTC)
    # matplotlib's stubs leave these two constructors unannotated.
    locator = AutoDateLocator(tz=UTC, minticks=3, maxticks=8)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    formatter = ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_formatter(formatter)
    axes.set_xlabel("UTC")


_ALERT_ROW: Final = ' class="alert"'


def _legend_outside(axes: Axes, handles: Sequence[Artist] | None = None) -> None:
    """The legend right of the plot area; constrained layout makes room for it."""
    if handles is None:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    else:
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def _date_number(moment: datetime) -> float:
    # Matplotlib's date unit: days since its default epoch, 1970-01-01 UTC.
    return utc(moment).timestamp() / 86400


def _count(value: float, _position: float) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _no_data(axes: Axes) -> None:
    axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes."""
    buffer = BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _e(text: str) -> str:
    return html.escape(text, quote=True)
