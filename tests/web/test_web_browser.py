"""The dashboard in a real headless Chromium, against a running daemon with stand-in workers.

Each test opens the page once and then only watches it: every change must arrive by the live
stream (a marker set in the page's window proves it was never reloaded).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import free_port, http_json
from tests.web.browser import VIEWPORT, browser  # noqa: F401 - the fixture
from tests.web.support import Page, config_text, dashboard_daemon, generating

TIMEOUT_MS = 60_000


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Page, dict[str, Any]]]:
    servers = {"alpha": entry(free_port(), description="the coder"), "beta": entry(free_port(), method="kivi", bits=2)}
    with dashboard_daemon(tmp_path, servers) as (h, page):
        yield h, page, servers


def open_page(browser: Any, page: Page) -> Any:  # noqa: F811
    tab = browser.new_page(viewport=VIEWPORT)
    tab.goto(page.url)
    tab.wait_for_selector("tr[data-server='alpha'][data-state='ready']", timeout=TIMEOUT_MS)
    tab.evaluate("window.veloxdTestMarker = 'not reloaded'")
    return tab


def row(tab: Any, name: str) -> Any:
    return tab.locator(f"tr[data-server='{name}']")


def test_page_lists_servers_follows_an_edit_and_a_killed_worker(
    browser: Any,  # noqa: F811 - the fixture imported above
    running: tuple[DaemonHarness, Page, dict[str, Any]],
    tmp_path: Path,
) -> None:
    """Rows for both servers (state, method and bits, measured KV ratio, memory); adding a server
    to veloxd.yaml adds its row; a worker killed with SIGKILL comes back with restarts 1; removing
    a server removes its row."""
    h, page, servers = running
    tab = open_page(browser, page)
    alpha, beta = row(tab, "alpha"), row(tab, "beta")
    assert "the coder" in alpha.inner_text()
    assert beta.locator(".method").inner_text().startswith("kivi · 2 bit")
    assert beta.locator(".kv .ratio").inner_text() == "25.0%"  # at the length it names below it
    assert "MiB" in alpha.locator(".memory").inner_text()

    for _ in range(3):
        assert http_json(f"http://127.0.0.1:{servers['alpha']['port']}/v1/chat/completions", {"messages": []})[0] == 200
    tab.wait_for_function(
        "document.querySelector(\"tr[data-server='alpha'] .requests\").textContent === '3'", timeout=TIMEOUT_MS
    )

    servers["gamma"] = entry(free_port(), method="snapkv")
    h.write(config_text(servers, {"port": page.port, "interval_s": 0.5}))
    tab.wait_for_selector("tr[data-server='gamma'][data-state='ready']", timeout=TIMEOUT_MS)
    assert row(tab, "gamma").locator(".method").inner_text().startswith("snapkv")

    pid = h.server("alpha")["pid"]
    os.kill(pid, signal.SIGKILL)
    tab.wait_for_function(
        "(() => { const r = document.querySelector(\"tr[data-server='alpha']\");"
        " return r && r.dataset.state === 'ready' && r.querySelector('.restarts').textContent === '1'; })()",
        timeout=TIMEOUT_MS,
    )
    assert str(pid) not in alpha.inner_text() and str(h.server("alpha")["pid"]) in alpha.inner_text()

    del servers["gamma"]  # removed from the file: its row goes
    h.write(config_text(servers, {"port": page.port, "interval_s": 0.5}))
    tab.wait_for_selector("tr[data-server='gamma']", state="detached", timeout=TIMEOUT_MS)
    assert tab.locator("#servers tbody tr").count() == 2
    assert tab.evaluate("window.veloxdTestMarker") == "not reloaded"
    shot = tmp_path / "dashboard.png"
    tab.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    tab.close()


def test_log_tail_filters_by_text_and_server(browser: Any, running: tuple[DaemonHarness, Page, dict[str, Any]]) -> None:  # noqa: F811
    """The tail shows both servers' events; a filter keeps only matching lines, live ones too;
    choosing a server keeps only its lines."""
    h, page, _ = running
    tab = open_page(browser, page)
    lines = tab.locator("#log-lines li")
    tab.wait_for_function("document.querySelectorAll('#log-lines li').length > 5", timeout=TIMEOUT_MS)
    everything = lines.all_inner_texts()
    assert any("server_ready" in line for line in everything) and any("beta" in line for line in everything)

    tab.fill("#log-filter", "fake worker: loading")
    tab.wait_for_function(
        "[...document.querySelectorAll('#log-lines li')].every(li => li.textContent.includes('fake worker: loading'))",
        timeout=TIMEOUT_MS,
    )
    assert lines.count() >= 2  # one per server (and the dashboard's own events are filtered out)

    tab.select_option("#log-server", "beta")
    tab.wait_for_function(
        "[...document.querySelectorAll('#log-lines li')].every(li => li.dataset.server === 'beta')", timeout=TIMEOUT_MS
    )
    assert lines.count() >= 1 and all("loading" in text for text in lines.all_inner_texts())

    tab.fill("#log-filter", "")
    h.cli("restart", "beta")  # new events arrive live and respect the chosen server
    tab.wait_for_function(
        "[...document.querySelectorAll('#log-lines li')].some("
        "li => li.textContent.includes('server_restart_requested'))",
        timeout=TIMEOUT_MS,
    )
    assert {li for li in tab.eval_on_selector_all("#log-lines li", "ls => ls.map(l => l.dataset.server)")} == {"beta"}
    assert tab.evaluate("window.veloxdTestMarker") == "not reloaded"
    tab.close()


@pytest.mark.slow
def test_dashboard_with_real_workers(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Two real `veloxd serve` workers on the shipped tiny model under load: the page shows their
    measured KV ratios and nonzero tokens per second. The screenshot goes to the test's output (the
    README's, docs/dashboard.png, is the gateway's page: tests/web/test_web_gateway_model.py)."""
    from tests.support import REPO

    model = str(REPO / "veloxd" / "assets" / "tiny-llama")
    h = DaemonHarness(tmp_path, real_worker=True)
    page = Page(h, free_port())

    def real(method: str, bits: int, description: str, **extra: Any) -> dict[str, Any]:
        return entry(
            free_port(), model=model, method=method, bits=bits, ready_timeout_s=300, description=description, **extra
        )

    servers = {
        "coder": real("kivi", 2, "KIVI 2-bit keys and values", overrides={"kivi_residual_length": 32}),
        "chat": real("affine", 4, "affine 4-bit, per-token groups"),
    }
    h.write(config_text(servers, {"port": page.port, "interval_s": 1.0}))
    try:
        h.start()
        h.wait_states({"coder": "ready", "chat": "ready"}, timeout=300)
        page.wait_ready()
        tab = browser.new_page(viewport=VIEWPORT)
        tab.goto(page.url)
        story = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 48}
        with generating([(f"http://127.0.0.1:{s['port']}/v1/chat/completions", story) for s in servers.values()]):
            tab.wait_for_function(
                "[...document.querySelectorAll('td.tps')].every(td => parseFloat(td.textContent) > 0)",
                timeout=120_000,
            )
            tab.wait_for_timeout(15_000)  # some chart history
            for name in servers:  # measured at start: compressed caches hold fewer bytes than fp16
                assert float(row(tab, name).locator(".kv .ratio").inner_text().rstrip("%")) < 100
            assert row(tab, "coder").locator(".model").inner_text() == "tiny-llama"
            shot = tmp_path / "dashboard.png"
            tab.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        tab.close()
        assert h.stop(timeout=60) == 0
    finally:
        h.cleanup()
