"""Report pages as a browser shows them: headless Chromium loads a page, and the charts' pixels
are checked for the marks of an empty or degenerate chart.

Chromium is Debian's ``chromium`` package (``make chromium`` installs it; ``DELAYQ_CHROMIUM``
names another binary). Without it the tests that use it fail: they are never skipped.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
from numpy.typing import NDArray
from PIL import Image

CHROMIUM: Final = Path(os.environ.get("DELAYQ_CHROMIUM", "/usr/bin/chromium"))
HEADLESS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
LOAD_SECONDS: Final = 60
# Appended to a copy of the page: once everything has loaded, what the browser made of the
# images and the highlighted facts goes into the DOM, which --dump-dom prints.
PROBE: Final = """<script>
window.addEventListener("load", () => {
  const out = {
    title: document.title,
    images: [...document.images].map((i) => ({
      src: i.getAttribute("src"), natural_width: i.naturalWidth,
      natural_height: i.naturalHeight, shown_width: i.getBoundingClientRect().width,
    })),
    alerts: [...document.querySelectorAll("tr.alert")].map((r) => ({
      text: r.innerText, color: getComputedStyle(r.querySelector("td")).color,
    })),
  };
  const pre = document.createElement("pre");
  pre.id = "delayq-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
RESULT: Final = re.compile(r'<pre id="delayq-probe">(.*?)</pre>', re.DOTALL)

# A chart's plot area is framed by dark spines spanning most of the image; data is drawn in
# colour (lines, markers, bars), everything else (text, axes, grid, the threshold) in greys.
DARK: Final = 80
SPINE_SHARE: Final = 0.3
COLOURED: Final = 60
MIN_DATA_PIXELS: Final = 20
MIN_PLOT_SHARE: Final = 0.4


@dataclass(frozen=True)
class PageImage:
    """An <img> as the browser loaded it (natural size 0: it did not load)."""

    src: str
    natural_width: int
    natural_height: int
    shown_width: float


@dataclass(frozen=True)
class Alert:
    """A highlighted fact row: its text and the computed colour of its value."""

    text: str
    color: str


@dataclass(frozen=True)
class Page:
    """What headless Chromium made of a page."""

    title: str
    images: tuple[PageImage, ...]
    alerts: tuple[Alert, ...]


def chromium() -> Path:
    """The Chromium binary; fails the test (never skips it) when it is not installed."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"headless Chromium not found at {CHROMIUM}: `make chromium` installs Debian's "
            "chromium package (as root: apt-get install -y --no-install-recommends chromium), "
            "or set DELAYQ_CHROMIUM to a Chromium binary",
            pytrace=False,
        )
    return CHROMIUM


def load(page: Path) -> Page:
    """Load `page` (its images relative to it) in headless Chromium and report what it shows."""
    binary = chromium()
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        with tempfile.TemporaryDirectory(prefix="delayq-chromium-") as profile:
            done = subprocess.run(  # noqa: S603 -- a fixed binary, fixed flags, a local file
                [binary, *HEADLESS, f"--user-data-dir={profile}", "--dump-dom", probe.as_uri()],
                capture_output=True,
                text=True,
                timeout=LOAD_SECONDS,
                check=False,
            )
    finally:
        probe.unlink()
    found = RESULT.search(done.stdout)
    assert found, f"Chromium did not load {page} (exit {done.returncode}): {done.stderr[-2000:]}"
    data: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return Page(
        data["title"],
        tuple(PageImage(**image) for image in data["images"]),
        tuple(Alert(**alert) for alert in data["alerts"]),
    )


def chart_problems(png: Path) -> list[str]:
    """Why the chart in `png` is empty or degenerate: no problems, no list entries."""
    pixels: NDArray[np.int16] = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    height, width, _ = pixels.shape
    if height < 100 or width < 100:
        return [f"{png.name}: {width}x{height} pixels is too small"]
    if (pixels == pixels[0, 0]).all():
        return [f"{png.name}: blank (a single colour)"]
    dark = pixels.max(axis=2) < DARK
    rows = np.flatnonzero(dark.sum(axis=1) > SPINE_SHARE * width)
    columns = np.flatnonzero(dark.sum(axis=0) > SPINE_SHARE * height)
    if len(rows) < 2 or len(columns) < 2:
        return [f"{png.name}: no framed plot area"]
    top, bottom, left, right = rows[0], rows[-1], columns[0], columns[-1]
    problems = []
    if (right - left) < MIN_PLOT_SHARE * width or (bottom - top) < MIN_PLOT_SHARE * height:
        problems.append(f"{png.name}: the plot area is only {right - left}x{bottom - top} pixels")
    inside = pixels[top + 2 : bottom - 1, left + 2 : right - 1]
    coloured = int((inside.max(axis=2) - inside.min(axis=2) > COLOURED).sum())
    if coloured < MIN_DATA_PIXELS:
        problems.append(f"{png.name}: no data drawn in the plot area ({coloured} data pixels)")
    return problems
