"""The dashboard's panels in a real headless Chromium: the gateway's memory panel, the log tail
without mlx_lm's per-request lines (a toggle shows them), the failed-reload banner, the charts'
series and ticks, and the layout at 420 px. Stand-in workers: no model loads.
"""

from __future__ import annotations

import itertools
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import FAKE_WORKER, DaemonHarness, entry
from tests.gateway.support import post
from tests.support import free_port
from tests.web.browser import VIEWPORT, browser  # noqa: F401 - the fixture
from tests.web.support import Page, config_text, dashboard_daemon, gateway_daemon

TIMEOUT_MS = 60_000
# What mlx_lm's server logs around each request (mlx_lm/server.py), as the daemon's log carries it.
PROGRESS_LINES = (
    "INFO Prompt processing progress: 9/9",
    "INFO Prompt Cache: 1 sequences, 0.00 GB",
    "INFO - KVCache: 1 sequences, 0.00 GB",
)


def chatty_worker(root: Path) -> str:
    """A worker command: mlx_lm's progress lines on stderr, then the stand-in worker."""
    script = root / "chatty_worker.sh"
    echoes = "".join(f"echo {shlex.quote(line)} >&2\n" for line in PROGRESS_LINES)
    script.write_text(f'#!/bin/sh\n{echoes}exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_WORKER))} "$@"\n')
    return f"sh {shlex.quote(str(script))}"


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Page, dict[str, Any]]]:
    servers = {"alpha": entry(free_port()), "beta": entry(free_port(), method="kivi", bits=2)}
    with dashboard_daemon(tmp_path, servers, worker_command=chatty_worker(tmp_path)) as (h, page):
        yield h, page, servers


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Page]]:
    with gateway_daemon(tmp_path, {}) as running:
        yield running


def open_page(browser: Any, page: Page, width: int = VIEWPORT["width"]) -> Any:  # noqa: F811
    tab = browser.new_page(viewport={**VIEWPORT, "width": width})
    missing: list[str] = []
    tab.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    tab.goto(page.url)
    tab.wait_for_selector("tr[data-server='alpha'][data-state='ready']", timeout=TIMEOUT_MS)
    tab.evaluate("window.veloxdTestMarker = 'not reloaded'")
    tab.missing = missing
    return tab


def admission(tab: Any, name: str) -> str:
    return str(tab.locator(f"#memory-table tr[data-entry='{name}'] .admission").inner_text())


def test_memory_panel_shows_budget_use_needs_and_what_admission_would_unload(
    browser: Any,  # noqa: F811
    gateway: tuple[DaemonHarness, Page],
) -> None:
    _, page = gateway
    tab = open_page(browser, page)
    tab.wait_for_selector("#memory:not([hidden]) tr[data-entry='two']", timeout=TIMEOUT_MS)
    summary = tab.locator("#memory-summary").inner_text()
    assert summary.startswith("budget 1.4 MiB (gateway.memory_budget) · running servers need ")
    assert [r for r in tab.eval_on_selector_all("#memory-table tbody tr", "rs => rs.map(r => r.dataset.entry)")] == [
        "alpha",
        "one",
        "two",
    ]
    assert tab.locator("#memory-table tr[data-entry='one'] .need").inner_text() == "976.6 KiB"  # 1 MB of weights
    assert admission(tab, "alpha") == ""  # always runs: nothing to decide
    assert admission(tab, "one") == admission(tab, "two") == "fits: starts at once"

    assert post(page.url.rstrip("/"), "/v1/completions", {"model": "one", "prompt": "x"})[0] == 200
    tab.wait_for_function(
        "(() => { const c = document.querySelector(\"#memory-table tr[data-entry='two'] .admission\");"
        " return c && c.textContent === 'starting it would unload one'; })()",
        timeout=TIMEOUT_MS,
    )
    tab.wait_for_selector("#memory-table tr[data-entry='one'] .state-ready", timeout=TIMEOUT_MS)
    # The tokens-per-second chart draws model servers only; memory includes the gateway's own process.
    tab.wait_for_function("document.querySelector('#chart-tps').dataset.series === 'alpha|one|two'", timeout=TIMEOUT_MS)
    assert "@gateway" in tab.locator("#chart-memory").get_attribute("data-series")
    ticks = tab.locator("#chart-memory").get_attribute("data-ticks").split("|")
    assert len({tick.split()[1] for tick in ticks}) == 1, ticks  # one unit on the axis
    steps = {round(float(b.split()[0]) - float(a.split()[0]), 6) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1 and f"{steps.pop():e}"[0] in "125", ticks  # a round step: 1, 2 or 5 x 10^k
    assert tab.missing == [] and tab.evaluate("window.veloxdTestMarker") == "not reloaded"
    tab.close()


def test_log_tail_hides_mlx_lm_progress_until_asked_and_a_failed_reload_is_a_banner(
    browser: Any,  # noqa: F811
    dashboard: tuple[DaemonHarness, Page, dict[str, Any]],
) -> None:
    h, page, servers = dashboard
    tab = open_page(browser, page)
    tab.wait_for_function("document.querySelectorAll('#log-lines li').length > 5", timeout=TIMEOUT_MS)
    shown = tab.locator("#log-lines").inner_text()
    assert "fake worker: loading" in shown
    assert not any(line in shown for line in PROGRESS_LINES)
    tab.check("#log-progress")
    tab.wait_for_function(
        "document.querySelector('#log-lines').textContent.includes('Prompt processing progress: 9/9')",
        timeout=TIMEOUT_MS,
    )
    assert all(line in tab.locator("#log-lines").inner_text() for line in PROGRESS_LINES)
    tab.uncheck("#log-progress")
    assert "Prompt processing progress" not in tab.locator("#log-lines").inner_text()

    assert tab.locator("#reload-failed").is_hidden()
    broken = config_text(servers, {"port": page.port, "interval_s": 0.5}).replace(
        '"method": "kivi"', '"method": "kiwi"'
    )
    h.write(broken)
    tab.wait_for_selector("#reload-failed:not([hidden])", timeout=TIMEOUT_MS)
    banner = tab.locator("#reload-failed").inner_text()
    assert "Config reload failed" in banner and "unknown method 'kiwi'; did you mean 'kivi'?" in banner
    assert "The last good config still runs." in banner
    tab.click("#reload-failed-link")
    assert tab.input_value("#log-filter") == "config_reload_failed"
    last = tab.locator("#log-lines li").last
    assert "config_reload_failed" in last.inner_text() and "flash" in str(last.get_attribute("class"))

    h.write(config_text(servers, {"port": page.port, "interval_s": 0.5}))  # fixed: the banner goes
    tab.wait_for_selector("#reload-failed", state="hidden", timeout=TIMEOUT_MS)
    assert tab.evaluate("window.veloxdTestMarker") == "not reloaded"
    tab.close()


def test_the_page_fits_a_420_px_window(
    browser: Any,  # noqa: F811
    dashboard: tuple[DaemonHarness, Page, dict[str, Any]],
    tmp_path: Path,
) -> None:
    _, page, _ = dashboard
    tab = open_page(browser, page, width=420)
    tab.wait_for_function("document.querySelectorAll('#log-lines li').length > 5", timeout=TIMEOUT_MS)
    # name, state, KV ratio and tokens per second stay in view; read in one turn of the page's
    # script, as each sample re-renders the rows
    boxes = tab.wait_for_function(
        """() => {
          const out = {};
          for (const name of ["alpha", "beta"]) {
            for (const cell of [".name", ".state", ".kv", ".tps"]) {
              const el = document.querySelector(`tr[data-server='${name}'] ${cell}`);
              const r = el && el.getBoundingClientRect();
              if (!r || r.width === 0) return null;
              out[`${name} ${cell}`] = [r.x, r.width];
            }
          }
          return out;
        }""",
        timeout=TIMEOUT_MS,
    ).json_value()
    assert tab.evaluate("document.documentElement.scrollWidth") <= 420  # no sideways scrolling of the page
    assert all(x >= 0 and x + width <= 420 for x, width in boxes.values()), boxes
    assert tab.locator("tr[data-server='alpha'] .model").is_hidden()
    filter_box = tab.locator("#log-filter").bounding_box()
    assert filter_box is not None and filter_box["x"] + filter_box["width"] <= 420
    tab.screenshot(path=str(tmp_path / "dashboard-420.png"), full_page=True)
    assert tab.missing == []  # the favicon included: nothing the page asks for is missing
    tab.close()
