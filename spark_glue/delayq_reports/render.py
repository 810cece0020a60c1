"""Charts (PNG bytes, matplotlib without pyplot) and the HTML summaries, from collected rows.

Everything here works on small, already aggregated data on the driver; nothing touches Spark.
Times arrive as PySpark gives them (naive datetimes in the driver's local zone) and are shown
in UTC.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from io import BytesIO

from matplotlib.axes import Axes
from matplotlib.figure import Figure

Point = tuple[datetime, float]


@dataclass(frozen=True)
class Link:
    """A labelled relative link."""

    label: str
    href: str


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
) -> bytes:
    """One line per series over time; `mark` highlights one point (such as the peak)."""
    figure, axes = _figure(title, ylabel)
    for label, points in sorted(series.items()):
        ordered = sorted(points)
        xs = [_date_number(x) for x, _ in ordered]
        axes.plot(xs, [y for _, y in ordered], label=label, marker=".")
    axes.xaxis_date(UTC)
    if mark is not None:
        axes.annotate(
            f"peak {mark[1]:,.0f}",
            (_date_number(mark[0]), mark[1]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    if not any(series.values()):
        _no_data(axes)
    elif log_y:
        axes.set_yscale("symlog", linthresh=10)
    if len(series) > 1:
        axes.legend(loc="best", fontsize="small")
    figure.autofmt_xdate()
    return _png(figure)


def bar_chart(
    title: str,
    ylabel: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    stacked: bool = False,
) -> bytes:
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
    if len(series) > 1:
        axes.legend(loc="best", fontsize="small")
    return _png(figure)


def summary_html(
    title: str,
    facts: Sequence[tuple[str, str]],
    tables: Sequence[TableLinks] = (),
    charts: Sequence[Link] = (),
    links: Sequence[Link] = (),
) -> str:
    """A self-contained HTML page: key figures, links to reports or tables, embedded charts."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;"
        "text-align:left}img{max-width:100%;border:1px solid #eee;margin:.5em 0}</style>",
        "</head><body>",
        f"<h1>{_e(title)}</h1>",
    ]
    if facts:
        parts.append("<table>")
        parts.extend(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
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


def _date_number(moment: datetime) -> float:
    # Matplotlib's date unit: days since its default epoch, 1970-01-01 UTC.
    return utc(moment).timestamp() / 86400


def _no_data(axes: Axes) -> None:
    axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)


def _png(figure: Figure) -> bytes:
    buffer = BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _e(text: str) -> str:
    return html.escape(text, quote=True)
