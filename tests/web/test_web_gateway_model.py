"""/metrics on the gateway's port with real `veloxd serve` workers on the shipped tiny model.

Known events (N completions, an on-demand start, its idle unload) are checked against the scraped
series, parsed with prometheus_client's parser: the gateway's own counters, the workers' request
counters and histograms, and the daemon's states and measured KV figures.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness
from tests.gateway.support import GATEWAY, LOAD_S, gateway_yaml, post, real_entry
from tests.support import REPO, free_port, wait_until
from tests.web.browser import VIEWPORT, browser  # noqa: F401 - the fixture
from tests.web.support import Page, generating

REQUESTS = 3


@pytest.mark.slow
def test_gateway_metrics_with_real_workers(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path, real_worker=True)
    page = Page(h, free_port(), process=GATEWAY)
    servers = {
        "coder": real_entry(method="kivi", bits=4, aliases=["code"]),
        "lazy": real_entry(start="on_demand", idle_unload_s=2),
    }
    h.write(gateway_yaml({"port": page.port}, servers))
    try:
        h.start()
        h.wait_states({GATEWAY: "ready", "coder": "ready", "lazy": "stopped"}, timeout=LOAD_S)
        base = page.url.rstrip("/")
        generated = prompt = 0
        for i in range(REQUESTS):
            body = {"model": "code", "messages": [{"role": "user", "content": f"count to {i}"}], "max_tokens": 6}
            status, answer = post(base, "/v1/chat/completions", body, timeout=LOAD_S)
            assert status == 200, answer
            generated += answer["usage"]["completion_tokens"]
            prompt += answer["usage"]["prompt_tokens"]
        status, answer = post(
            base, "/v1/completions", {"model": "lazy", "prompt": "hi", "max_tokens": 4}, timeout=LOAD_S
        )
        assert status == 200, answer  # started on demand by this request
        h.wait_event("server_idle_unloaded", server="lazy", timeout=LOAD_S)

        metrics = page.wait_metrics(
            ("veloxd_gateway_unloads_total", {"server": "lazy", "reason": "idle"}, 1),
            ("veloxd_server_state", {"server": "lazy", "state": "stopped"}, 1),
            ("veloxd_requests_total", {"server": "coder", "status": "200"}, REQUESTS),
            ("veloxd_generated_tokens_total", {"server": "coder"}, generated),
            ("veloxd_request_duration_seconds_count", {"server": "coder"}, REQUESTS),
        )
        (tmp_path / "metrics.txt").write_text(page.metrics_text())  # a scrape, kept in the test's output

        def value(name: str, **labels: str) -> float | None:
            return metrics.get((name, frozenset(labels.items())))

        # The gateway's own counters.
        assert value("veloxd_gateway_admissions_total", server="lazy") == 1
        assert value("veloxd_gateway_requests_total", server="coder", status="200") == REQUESTS
        assert value("veloxd_gateway_requests_total", server="lazy", status="200") == 1
        assert value("veloxd_gateway_queue_depth", server="coder") == 0
        # The worker's counters, read from its /veloxd/stats.
        assert value("veloxd_generated_tokens_total", server="coder") == generated
        assert value("veloxd_prompt_tokens_total", server="coder") == prompt
        assert value("veloxd_time_to_first_token_seconds_count", server="coder") == REQUESTS
        assert value("veloxd_request_duration_seconds_count", server="coder") == REQUESTS
        assert value("veloxd_request_duration_seconds_bucket", server="coder", le="+Inf") == REQUESTS
        assert (value("veloxd_request_duration_seconds_sum", server="coder") or 0) > 0
        assert value("veloxd_requests_in_flight", server="coder") == 0
        assert value("veloxd_request_queue_depth", server="coder") == 0
        rate = value("veloxd_generation_tokens_per_second", server="coder")
        assert rate is not None and rate >= 0  # exported from the first scrape; its change is checked below
        # The daemon's facts: states, restarts, startup, measured KV bytes, resident memory (psutil).
        assert value("veloxd_server_state", server="coder", state="ready") == 1
        assert value("veloxd_server_restarts_total", server="coder") == 0
        assert (value("veloxd_server_startup_seconds", server="coder") or 0) > 0
        method = value("veloxd_kv_cache_bytes_per_token", server="coder", cache="method") or 0
        fp16 = value("veloxd_kv_cache_bytes_per_token", server="coder", cache="fp16") or 0
        ratio = value("veloxd_kv_cache_compression_ratio", server="coder") or 0
        # Bytes per added token vs totals at READY's reference length: KIVI's fp16 residual window
        # counts in the totals, so the ratio is above the per-token one, and both below fp16.
        assert 0 < method / fp16 <= ratio < 1
        assert (value("veloxd_worker_resident_memory_bytes", server="coder") or 0) > 50_000_000
        assert value("veloxd_server_info", server="coder", model=real_entry()["model"], method="kivi", bits="4") == 1

        # Tokens per second: the counters' change between two samples, nonzero while coder generates.
        story = {"model": "coder", "messages": [{"role": "user", "content": "a story"}], "max_tokens": 32}
        with generating([(base + "/v1/chat/completions", story)], timeout=LOAD_S):
            wait_until(
                lambda: (page.value("veloxd_generation_tokens_per_second", server="coder") or 0) > 0,
                LOAD_S,
                interval=0.2,
                what="veloxd_generation_tokens_per_second > 0 under load",
            )
        assert h.stop(timeout=60) == 0
    finally:
        h.cleanup()


@pytest.mark.slow
def test_gateway_dashboard_with_real_workers(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """The page on the gateway's port with two real workers under load (through the gateway) and an
    on-demand one not started: every server listed, measured KV ratios below fp16's, nonzero tokens
    per second. Its screenshot goes to the test's output, and to docs/dashboard.png (the README's)
    with VELOXD_DOCS_SCREENSHOT=1."""
    h = DaemonHarness(tmp_path, real_worker=True)
    page = Page(h, free_port(), process=GATEWAY)
    servers = {
        "coder": real_entry(
            method="kivi", bits=2, overrides={"kivi_residual_length": 32}, description="KIVI 2-bit keys and values"
        ),
        "chat": real_entry(method="affine", bits=4, description="affine 4-bit, per-token groups"),
        "reasoner": real_entry(method="turboquant_mse", bits=3, start="on_demand", description="started on demand"),
    }
    h.write(gateway_yaml({"port": page.port}, servers))
    try:
        h.start()
        h.wait_states({GATEWAY: "ready", "coder": "ready", "chat": "ready", "reasoner": "stopped"}, timeout=LOAD_S)
        tab = browser.new_page(viewport=VIEWPORT)
        tab.goto(page.url)
        story = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 48}
        url = page.url + "v1/chat/completions"
        with generating([(url, {**story, "model": name}) for name in ("coder", "chat")], timeout=LOAD_S):
            tab.wait_for_function(
                "['coder', 'chat'].every(n => parseFloat("
                "document.querySelector(`tr[data-server='${n}'] td.tps`)?.textContent) > 0)",
                timeout=LOAD_S * 1000,
            )
            tab.wait_for_timeout(15_000)  # some chart history for the screenshot
            for name in ("coder", "chat"):  # measured at start: compressed caches hold fewer bytes than fp16
                assert float(tab.locator(f"tr[data-server='{name}'] .kv .ratio").inner_text().rstrip("%")) < 100
            assert tab.locator("tr[data-server='reasoner']").get_attribute("data-state") == "stopped"
            assert tab.locator(f"tr[data-server='{GATEWAY}']").get_attribute("data-state") == "ready"
            shot = tmp_path / "dashboard.png"
            tab.screenshot(path=str(shot), full_page=True)
            if os.environ.get("VELOXD_DOCS_SCREENSHOT"):
                tab.screenshot(path=str(REPO / "docs" / "dashboard.png"), full_page=True)
            assert shot.stat().st_size > 10_000
        tab.close()
        assert h.stop(timeout=60) == 0
    finally:
        h.cleanup()
