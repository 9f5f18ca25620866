"""The charts' legends with many servers, in a real headless Chromium: every series is named in
full inside its canvas (the rows wrap, the canvas grows by them, the plot stays clear of them) and
no two series look alike (past the palette's colours, a dash pattern). Stand-in workers: no model
loads. What is checked is read back from the canvas's pixels, not only from what the page says it drew.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import free_port
from tests.web.browser import VIEWPORT, browser  # noqa: F401 - the fixture
from tests.web.support import Page, dashboard_daemon

TIMEOUT_MS = 60_000
# Eleven servers, some with long names: one more than the palette has colours, and far more than
# one row of legend holds (the legend once put entry i at 72 + 110 * i px, whatever its width).
NAMES = [
    "coder",
    "chat-assistant-large",
    "summarizer",
    "embed",
    "translator-de-en",
    "reranker",
    "vision-lite",
    "draft",
    "judge",
    "math-tutor",
    "sql-writer-small",
]
CHARTS = ("chart-memory", "chart-tps")

# For each chart, in one turn of the page's script (each sample redraws the charts): its size,
# where the plot starts, its series, and per legend entry what the page says it drew, plus from the
# pixels: the swatch's pattern along its middle (x: drawn in the entry's colour, .: not) and the
# leftmost and rightmost columns drawn in that colour in the entry's lane of its row.
READ_LEGENDS = """(ids) => ids.map((id) => {
  const canvas = document.getElementById(id);
  if (!canvas || !canvas.dataset.legend) return null;
  const ratio = window.devicePixelRatio || 1;
  const image = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  const inColor = (x, y, rgb) => {
    const k = (Math.floor(y * ratio) * image.width + Math.floor(x * ratio)) * 4, d = image.data;
    return d[k + 3] > 160 && [0, 1, 2].every((c) => Math.abs(d[k + c] - rgb[c]) < 48);
  };
  const drawn = JSON.parse(canvas.dataset.legend);
  const entries = drawn.map((e) => {
    const rgb = [1, 3, 5].map((i) => parseInt(e.color.slice(i, i + 2), 16));
    const mid = e.y + e.h / 2 - 0.5;
    let swatch = "";
    for (let x = e.x; x < e.x + e.swatch; x += 1) swatch += inColor(x + 0.5, mid, rgb) ? "x" : ".";
    // Its lane: from the end of the entry before it in its row to the start of the one after
    // (another entry may share its colour), or to the canvas's edges.
    const row = drawn.filter((o) => o !== e && o.y === e.y);
    const from = Math.max(0, ...row.filter((o) => o.x < e.x).map((o) => o.x + o.w));
    const to = Math.min(canvas.clientWidth, ...row.filter((o) => o.x > e.x).map((o) => o.x));
    let first = null, last = null;
    for (let x = from; x < to; x += 1) {
      for (let y = e.y; y < e.y + e.h; y += 1) {
        if (inColor(x + 0.5, y + 0.5, rgb)) { if (first === null) first = x; last = x; break; }
      }
    }
    return { ...e, drawn: swatch, first, last };
  });
  return {
    width: canvas.clientWidth,
    height: canvas.clientHeight,
    // Drawn at the size it is shown (a resize redraws it a moment later): pixels map to places.
    atSize: canvas.width === Math.floor(canvas.clientWidth * ratio)
      && canvas.height === Math.floor(canvas.clientHeight * ratio),
    plotTop: Number(canvas.dataset.plotTop),
    series: canvas.dataset.series.split("|"),
    entries,
  };
})"""


@pytest.fixture
def many(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Page]]:
    with dashboard_daemon(tmp_path, {name: entry(free_port()) for name in NAMES}) as running:
        yield running


def legends(tab: Any, width: int) -> list[dict[str, Any]]:
    """Both charts' legends once both name every server and are drawn at their size in a window
    `width` px wide."""
    return tab.wait_for_function(
        f"""() => {{
          if (window.innerWidth !== {width}) return null;
          const read = ({READ_LEGENDS})({list(CHARTS)});
          return read.every((c) => c && c.atSize && {NAMES}.every((n) => c.series.includes(n))) ? read : null;
        }}""",
        timeout=TIMEOUT_MS,
    ).json_value()


def check(chart: dict[str, Any]) -> int:
    """Every series named in full inside the canvas, above the plot, apart from the others, drawn in
    its colour; no two alike. Returns how many rows the legend took."""
    entries = chart["entries"]
    assert [e["name"] for e in entries] == chart["series"]
    for e in entries:
        assert e["text"] == e["name"], e  # the whole name, not cut
        assert e["x"] >= 0 and e["x"] + e["w"] <= chart["width"], (e, chart["width"])
        assert e["y"] >= 0 and e["y"] + e["h"] <= chart["plotTop"] <= chart["height"], (e, chart["plotTop"])
        assert "x" in e["drawn"], e  # the swatch is there in the series' colour
        # The name's pixels end where its entry ends (within a glyph's side bearing) and start at
        # the swatch: nothing of it is drawn past the entry, where a clipped name would be.
        assert e["first"] is not None and e["x"] <= e["first"] <= e["x"] + 1, e
        assert e["x"] + e["w"] - 6 <= e["last"] <= e["x"] + e["w"] + 1, e
    for a, b in itertools.combinations(entries, 2):
        apart = (
            a["x"] + a["w"] <= b["x"]
            or b["x"] + b["w"] <= a["x"]
            or a["y"] + a["h"] <= b["y"]
            or b["y"] + b["h"] <= a["y"]
        )
        assert apart, (a, b)
    looks = {(e["color"], e["drawn"]) for e in entries}  # colour and dash pattern, as drawn
    assert len(looks) == len(entries), sorted(looks)
    return len({e["y"] for e in entries})


def test_every_series_is_named_in_the_legend_and_looks_its_own_with_eleven_servers(
    browser: Any,  # noqa: F811 - the fixture imported above
    many: tuple[DaemonHarness, Page],
    tmp_path: Path,
) -> None:
    _, page = many
    tab = browser.new_page(viewport=VIEWPORT)
    tab.goto(page.url)
    tab.wait_for_selector(f"tr[data-server='{NAMES[-1]}'][data-state='ready']", timeout=TIMEOUT_MS)
    wide = legends(tab, VIEWPORT["width"])
    rows_wide = [check(chart) for chart in wide]
    assert all(rows > 1 for rows in rows_wide), rows_wide  # one row does not hold eleven names
    # Eleven servers, ten colours: one colour comes round again, told apart by its dash (check()).
    for chart in wide:
        shared = [(a, b) for a, b in itertools.combinations(chart["entries"], 2) if a["color"] == b["color"]]
        assert len(shared) == 1 and "." in shared[0][1]["drawn"] and "." not in shared[0][0]["drawn"], shared

    tab.set_viewport_size({**VIEWPORT, "width": 420})  # a phone: the charts redraw narrower
    narrow = legends(tab, 420)
    rows_narrow = [check(chart) for chart in narrow]
    assert all(n > w for n, w in zip(rows_narrow, rows_wide, strict=True)), (rows_narrow, rows_wide)
    assert all(n["height"] > w["height"] for n, w in zip(narrow, wide, strict=True))  # room made, plot kept
    tab.screenshot(path=str(tmp_path / "legend-420.png"), full_page=True)
    tab.close()
