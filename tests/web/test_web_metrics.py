"""`GET /metrics` of a running daemon, parsed with prometheus_client's parser, against known events.

Stand-in workers (tests/fixtures/fake_worker.py) count their requests with the real
veloxd.serve.stats; the slow test does the same through a real `veloxd serve` on the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import free_port, http_json, wait_until
from tests.web.support import Page, config_text

REQUESTS = 5
FAKE_TOKENS = 8  # the stand-in's tokens per completion


def test_metrics_count_requests_and_restarts(tmp_path: Path) -> None:
    """N good and 2 refused requests show as veloxd_requests_total by status, tokens and histograms
    follow; killing a worker shows as one restart, then as ready again; the states, memory and
    measured KV figures of both servers are there."""
    h = DaemonHarness(tmp_path)
    ports = {"alpha": free_port(), "beta": free_port()}
    page = Page(h, free_port())
    servers = {
        "alpha": entry(ports["alpha"]),
        "beta": entry(ports["beta"], method="kivi", bits=2),
        "broken": entry(free_port(), env={"FAKE_EXIT_CODE": "3"}),
    }
    h.write(config_text(servers, {"port": page.port, "interval_s": 0.5}))
    try:
        h.start()
        h.wait_states({"alpha": "ready", "beta": "ready", "broken": "fatal"})
        page.wait_ready()
        base = f"http://127.0.0.1:{ports['alpha']}/v1/chat/completions"
        for _ in range(REQUESTS):
            assert http_json(base, {"messages": [{"role": "user", "content": "hi"}]})[0] == 200
        for _ in range(2):
            assert http_json(base, {"model": "another/model", "messages": []})[0] == 404

        metrics = page.wait_metrics(
            ("veloxd_requests_total", {"server": "alpha", "status": "200"}, REQUESTS),
            ("veloxd_requests_total", {"server": "alpha", "status": "404"}, 2),
            ("veloxd_request_duration_seconds_count", {"server": "alpha"}, REQUESTS + 2),
            # Read from the same scrape as the counts (a CI run once saw a scrape without it).
            ("veloxd_server_state", {"server": "broken", "state": "fatal"}, 1),
        )

        def value(name: str, **labels: str) -> float | None:
            return metrics.get((name, frozenset(labels.items())))

        assert value("veloxd_requests_total", server="alpha", status="404") == 2
        assert value("veloxd_requests_total", server="beta", status="200") is None  # never asked
        assert value("veloxd_generated_tokens_total", server="alpha") == REQUESTS * FAKE_TOKENS
        assert value("veloxd_generated_tokens_total", server="beta") == 0
        assert value("veloxd_time_to_first_token_seconds_count", server="alpha") == REQUESTS
        assert value("veloxd_request_duration_seconds_count", server="alpha") == REQUESTS + 2
        assert value("veloxd_request_duration_seconds_bucket", server="alpha", le="+Inf") == REQUESTS + 2
        assert value("veloxd_requests_in_flight", server="alpha") == 0
        assert value("veloxd_daemon_up") == 1
        assert value("veloxd_server_state", server="broken", state="fatal") == 1
        assert value("veloxd_server_restarts_total", server="broken") == 2  # 3 failed starts, then fatal
        assert page.server("broken")["last_error"] == "fake worker: failing with code 3"
        for name in ("alpha", "beta"):
            assert value("veloxd_server_state", server=name, state="ready") == 1
            assert value("veloxd_server_state", server=name, state="backoff") == 0
            assert value("veloxd_server_restarts_total", server=name) == 0
            assert (value("veloxd_worker_resident_memory_bytes", server=name) or 0) > 1_000_000
            assert (value("veloxd_server_startup_seconds", server=name) or 0) > 0
        assert value("veloxd_kv_cache_compression_ratio", server="beta") == 0.25
        assert value("veloxd_kv_cache_bytes_per_token", server="beta", cache="fp16") == 512
        model = h.server("beta")["model"]  # the harness's local stand-in model directory
        assert value("veloxd_server_info", server="beta", model=model, method="kivi", bits="2") == 1

        pid = h.server("alpha")["pid"]
        os.kill(pid, signal.SIGKILL)
        page.wait_value("veloxd_server_restarts_total", 1, server="alpha")
        page.wait_value("veloxd_server_state", 1, server="alpha", state="ready")
        assert h.server("alpha")["pid"] != pid
        # A new worker process counts from zero (Prometheus' rate() treats it as a counter reset).
        wait_until(
            lambda: page.value("veloxd_generated_tokens_total", server="alpha") == 0,
            60,
            what="the new worker's counters",
        )
        assert page.value("veloxd_server_restarts_total", server="beta") == 0
        assert h.stop() == 0
    finally:
        h.cleanup()


@pytest.mark.slow
def test_metrics_of_a_real_worker(tmp_path: Path) -> None:
    """A real `veloxd serve` on the shipped tiny model: N completions (one streamed) are N requests,
    their tokens and first-token times are counted, and the measured KV ratio of READY is exported."""
    from tests.support import REPO

    model = REPO / "veloxd" / "assets" / "tiny-llama"
    h = DaemonHarness(tmp_path, real_worker=True)
    port = free_port()
    page = Page(h, free_port())
    h.write(
        config_text(
            {"tiny": entry(port, model=str(model), method="kivi", bits=4, ready_timeout_s=300)},
            {"port": page.port, "interval_s": 0.5},
        )
    )
    try:
        h.start()
        h.wait_states({"tiny": "ready"}, timeout=300)
        page.wait_ready()
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        generated = 0
        for i in range(3):
            status, body = http_json(
                url, {"messages": [{"role": "user", "content": f"count to {i}"}], "max_tokens": 6}, timeout=120
            )
            assert status == 200, body
            generated += body["usage"]["completion_tokens"]
        streamed = urllib.request.Request(
            url,
            data=json.dumps(
                {
                    "messages": [{"role": "user", "content": "stream"}],
                    "max_tokens": 5,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(streamed, timeout=120) as response:
            events = [
                json.loads(line[6:]) for line in response.read().decode().splitlines() if line.startswith("data: {")
            ]
        generated += next(e["usage"]["completion_tokens"] for e in events if e.get("usage"))
        metrics = page.wait_metrics(
            ("veloxd_requests_total", {"server": "tiny", "status": "200"}, 4),
            ("veloxd_generated_tokens_total", {"server": "tiny"}, generated),
            ("veloxd_time_to_first_token_seconds_count", {"server": "tiny"}, 4),
        )
        assert metrics[("veloxd_generated_tokens_total", frozenset({("server", "tiny")}))] == generated
        assert metrics[("veloxd_time_to_first_token_seconds_count", frozenset({("server", "tiny")}))] == 4
        assert 0 < metrics[("veloxd_kv_cache_compression_ratio", frozenset({("server", "tiny")}))] < 1
        assert metrics[("veloxd_prompt_tokens_total", frozenset({("server", "tiny")}))] > 0
        assert h.stop(timeout=60) == 0
    finally:
        h.cleanup()
