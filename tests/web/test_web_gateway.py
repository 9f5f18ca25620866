"""The dashboard and /metrics on the gateway's port, in front of stand-in workers (fast: no model loads).

With a `gateway:` block the gateway serves the page, its JSON/SSE endpoints and /metrics next to
/v1 (no `veloxd web` sidecar runs); its own counters (admissions, unloads, requests, queue) are
checked against the events the test causes. The same with the real model: test_web_gateway_model.py.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.fixtures.daemon_harness import DaemonHarness
from tests.gateway.support import GATEWAY, fake_entry, gateway_yaml, model_dir, models, post
from tests.support import free_port, http_json, wait_until
from tests.web.browser import VIEWPORT, browser  # noqa: F401 - the fixture
from tests.web.support import Page, gateway_daemon

TOKEN = "gw-s3cret"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
REQUESTS = 4
TIMEOUT_MS = 60_000


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Page]]:
    with gateway_daemon(
        tmp_path,
        {"api_key_env": "GW_KEY"},
        env={"GW_KEY": TOKEN},
        alpha={"aliases": ["fast"]},
        two={"idle_unload_s": 1},
    ) as running:
        yield running


def test_gateway_counts_admissions_unloads_and_requests_in_metrics(gateway: tuple[DaemonHarness, Page]) -> None:
    """N requests to alpha, one for an unknown model, a start of `one`, a start of `two` that unloads
    `one` to make room, then `two`'s idle unload: each shows in the gateway's series on its own port,
    next to the workers' counters and the servers' states; no sidecar runs."""
    h, page = gateway
    base = page.url.rstrip("/")
    for _ in range(REQUESTS):
        assert post(base, "/v1/chat/completions", {"model": "fast", "messages": []}, BEARER)[0] == 200
    assert post(base, "/v1/chat/completions", {"model": "nope", "messages": []}, BEARER)[0] == 404
    assert post(base, "/v1/completions", {"model": "one", "prompt": "x"}, BEARER)[0] == 200
    assert post(base, "/v1/completions", {"model": "two", "prompt": "x"}, BEARER)[0] == 200
    assert h.wait_event("server_unloaded", server="one")["reason"] == "admission"
    h.wait_event("server_idle_unloaded", server="two")

    metrics = page.wait_metrics(
        ("veloxd_gateway_unloads_total", {"server": "two", "reason": "idle"}, 1),
        ("veloxd_server_state", {"server": "two", "state": "stopped"}, 1),
        ("veloxd_requests_total", {"server": "alpha", "status": "200"}, REQUESTS),  # the worker's own count
        ("veloxd_gateway_requests_total", {"server": "", "status": "404"}, 1),
    )

    def value(name: str, **labels: str) -> float | None:
        return metrics.get((name, frozenset(labels.items())))

    assert value("veloxd_gateway_admissions_total", server="one") == 1
    assert value("veloxd_gateway_admissions_total", server="two") == 1
    assert value("veloxd_gateway_admissions_total", server="alpha") is None  # always: never admitted
    assert value("veloxd_gateway_unloads_total", server="one", reason="admission") == 1
    assert value("veloxd_gateway_unloads_total", server="one", reason="idle") is None  # no idle_unload_s
    assert value("veloxd_gateway_requests_total", server="alpha", status="200") == REQUESTS
    assert value("veloxd_gateway_requests_total", server="", status="404") == 1
    assert value("veloxd_gateway_requests_total", server="one", status="200") == 1
    assert value("veloxd_gateway_admission_refusals_total", server="one") is None
    for name in ("alpha", "one", "two"):
        assert value("veloxd_gateway_queue_depth", server=name) == 0
    assert value("veloxd_server_state", server="alpha", state="ready") == 1
    assert value("veloxd_server_state", server="one", state="stopped") == 1
    assert value("veloxd_server_state", server=GATEWAY, state="ready") == 1
    assert value("veloxd_daemon_up") == 1
    assert h.state()["dashboard"] is None  # the gateway is the one dashboard
    assert f"dashboard: http://127.0.0.1:{page.port}/ and /metrics (served by @gateway)" in h.cli("status").stdout


def test_gateway_guards_the_dashboard_with_its_token(gateway: tuple[DaemonHarness, Page]) -> None:
    """Reads from this machine are open (the page, /api/state, /metrics); a foreign Host needs the
    gateway's token; actions need it always, from the page's own origin; /v1 stays guarded."""
    h, page = gateway
    status, html = page.request("")
    assert status == 200 and isinstance(html, str) and 'src="static/app.js"' in html
    state = page.state()
    assert state["actions"] is True and state["actions_setting"] == "gateway.api_key_env"
    assert {s["name"] for s in state["servers"]} == {"alpha", "one", "two", GATEWAY}
    assert http_json(page.url + "v1/models")[0] == 401
    assert http_json(page.url + "health")[0] == 200

    rebound = {"Host": f"evil.example:{page.port}"}  # a DNS-rebinding page names its own host
    assert page.request("metrics", headers=rebound)[0] == 401
    assert page.request("metrics", headers={**rebound, **BEARER})[0] == 200

    assert page.request("api/reload", method="POST")[0] == 401
    foreign = {**BEARER, "Origin": "http://evil.example"}
    assert page.request("api/reload", method="POST", headers=foreign)[0] == 403
    mark = h.mark()
    status, answer = page.request("api/servers/alpha/restart", method="POST", headers=BEARER)
    assert status == 200 and isinstance(answer, dict) and answer["ok"], answer
    h.wait_event("server_ready", server="alpha", after=mark)
    page.wait_value("veloxd_server_restarts_total", 1, server="alpha")  # the page's restart is a restart


def test_gateway_page_starts_and_unloads_on_demand_servers(gateway: tuple[DaemonHarness, Page]) -> None:
    """Start and unload, the gateway's own actions: start goes through admission like a first request
    (counted as one), unload stops an idle on-demand server (counted with reason manual); `always`
    servers refuse both; both need the token."""
    h, page = gateway
    assert page.state()["server_actions"] == ["restart", "start", "unload"]
    assert page.request("api/servers/one/start", method="POST")[0] == 401
    status, answer = page.request("api/servers/alpha/start", method="POST", headers=BEARER)
    assert status == 409 and isinstance(answer, dict) and "start: always" in answer["error"]
    status, answer = page.request("api/servers/one/start", method="POST", headers=BEARER)
    assert status == 200 and answer == {"ok": True, "state": "starting", "already": False}, answer
    h.wait_states({"one": "ready"})
    status, answer = page.request("api/servers/one/start", method="POST", headers=BEARER)
    assert status == 200 and isinstance(answer, dict) and answer["already"] is True  # counted once
    page.wait_value("veloxd_gateway_admissions_total", 1, server="one")

    mark = h.mark()
    status, answer = page.request("api/servers/one/unload", method="POST", headers=BEARER)
    assert status == 200 and isinstance(answer, dict) and answer["ok"], answer
    assert h.wait_event("server_unloaded", server="one", after=mark)["reason"] == "manual"
    h.wait_states({"one": "stopped"})
    page.wait_value("veloxd_gateway_unloads_total", 1, server="one", reason="manual")
    assert page.request("api/servers/alpha/unload", method="POST", headers=BEARER)[0] == 409
    assert h.server("alpha")["state"] == "ready"


def test_a_start_asked_while_the_server_is_still_stopping_follows_the_stop(tmp_path: Path) -> None:
    """The page's start right after its unload, while the worker is still exiting (it ignores
    SIGTERM, so it stays stopping for its stop_timeout_s): the start is queued behind the stop and
    the server comes back, instead of an "already" that leaves it stopped."""
    h = DaemonHarness(tmp_path)
    page = Page(h, free_port(), process=GATEWAY)
    slow_stop = fake_entry(model_dir(tmp_path, "m"), start="on_demand", stop_timeout_s=6, env={"FAKE_IGNORE_TERM": "1"})
    h.write(gateway_yaml({"port": page.port, "api_key_env": "GW_KEY"}, {"slow": slow_stop}))
    try:
        h.start(env={"GW_KEY": TOKEN})
        h.wait_states({GATEWAY: "ready", "slow": "stopped"})
        assert page.request("api/servers/slow/start", method="POST", headers=BEARER)[0] == 200
        h.wait_states({"slow": "ready"})
        mark = h.mark()
        status, answer = page.request("api/servers/slow/unload", method="POST", headers=BEARER)
        assert status == 200 and isinstance(answer, dict) and answer["ok"] and not answer.get("already"), answer
        status, answer = page.request("api/servers/slow/start", method="POST", headers=BEARER)
        assert status == 200 and answer == {"ok": True, "state": "starting", "already": False}, answer
        h.wait_event("server_ready", server="slow", after=mark)
        events = [r["event"] for r in h.records()[mark:] if r.get("server") == "slow"]
        # the start was asked for while the worker was exiting, and the stop finished first
        assert events.index("server_start_requested") < events.index("server_stopped") < events.index("server_ready")
    finally:
        h.cleanup()


def click_action(tab: Any, selector: str, attempts: int = 5) -> str:
    """Click an action button and return the page's answer ("done" or "refused: why").

    The rows are rebuilt on every state update, so under load a click can meet a button that is
    being replaced and send nothing (a CI run saw that): each attempt clears the answer, clicks,
    and waits for a new one, within the usual deadline; a refusal is retried, then returned.
    """
    answer = ""
    for _ in range(attempts):
        tab.evaluate("document.getElementById('action-result').textContent = ''")
        tab.wait_for_selector(selector, state="visible", timeout=TIMEOUT_MS)
        tab.click(selector)
        try:
            tab.wait_for_function(
                "document.getElementById('action-result').textContent !== ''", timeout=TIMEOUT_MS / attempts
            )
        except PlaywrightTimeout:  # no answer: the click sent nothing; try again
            continue
        answer = tab.inner_text("#action-result")
        if answer == "done":
            return answer
    return answer or "no answer"


def test_gateway_page_in_a_browser_lists_the_servers(browser: Any, gateway: tuple[DaemonHarness, Page]) -> None:  # noqa: F811
    """The page on the gateway's port, in Chromium: a row per server with its state, on-demand ones
    stopped; a request for `one` turns its row ready without reloading the page; with the token
    typed in, `one`'s unload button stops it and its start button starts it again."""
    h, page = gateway
    tab = browser.new_page(viewport=VIEWPORT)
    try:
        tab.goto(page.url)
        tab.wait_for_selector("tr[data-server='alpha'][data-state='ready']", timeout=TIMEOUT_MS)
        tab.evaluate("window.veloxdTestMarker = 'not reloaded'")
        assert tab.locator("tr[data-server='one']").get_attribute("data-state") == "stopped"
        assert tab.locator("tr[data-server='two']").get_attribute("data-state") == "stopped"
        assert post(page.url.rstrip("/"), "/v1/completions", {"model": "one", "prompt": "x"}, BEARER)[0] == 200
        tab.wait_for_selector("tr[data-server='one'][data-state='ready']", timeout=TIMEOUT_MS)

        tab.click("#actions summary")
        tab.fill("#token", TOKEN)
        tab.click("#token-form button[type=submit]")
        one, two = "tr[data-server='one']", "tr[data-server='two']"
        assert tab.locator(f"{two} button.unload").is_hidden()  # stopped: only start is offered
        assert tab.locator(f"{one} button.start").is_hidden()  # ready: only unload
        assert tab.locator("tr[data-server='alpha'] button.start").is_hidden()  # always: never
        assert click_action(tab, f"{one} button.unload") == "done"
        tab.wait_for_selector(f"{one}[data-state='stopped']", timeout=TIMEOUT_MS)
        assert h.wait_event("server_unloaded", server="one")["reason"] == "manual"
        mark = h.mark()
        # `one`, not `two`: no idle_unload_s to end its ready state early
        assert click_action(tab, f"{one} button.start") == "done"
        h.wait_event("server_start_requested", server="one", after=mark)
        tab.wait_for_selector(f"{one}[data-state='ready']", timeout=TIMEOUT_MS)
        assert tab.evaluate("window.veloxdTestMarker") == "not reloaded"
    finally:
        tab.close()


def test_queue_depth_and_a_live_concurrency_change(tmp_path: Path) -> None:
    """With concurrency 1, a request behind a long stream is queued (veloxd_gateway_queue_depth 1); a
    reload to concurrency 2 lets the next request through at once, and when everything has finished
    the queue is 0 and the server is idle, so it unloads (the gateway's counts survive the change)."""
    h = DaemonHarness(tmp_path)
    page = Page(h, free_port(), process=GATEWAY)
    slow = {"FAKE_STREAM_CHUNKS": "400", "FAKE_CHUNK_DELAY_S": "0.05"}  # 20 s: outlasts the steps below
    lazy = fake_entry(model_dir(tmp_path, "m"), start="on_demand", idle_unload_s=1, concurrency=1, env=slow)
    h.write(gateway_yaml({"port": page.port}, {"lazy": lazy}))
    base = page.url.rstrip("/")
    first_chunk = threading.Event()
    answers: dict[str, tuple[int, bool] | int] = {}

    def stream() -> None:
        body = json.dumps({"model": "lazy", "prompt": "x", "stream": True}).encode()
        request = urllib.request.Request(
            base + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            response.readline()
            first_chunk.set()
            answers["stream"] = (response.status, response.read().endswith(b"data: [DONE]\n\n"))

    def queued() -> None:
        answers["queued"] = post(base, "/v1/completions", {"model": "lazy", "prompt": "y"})[0]

    try:
        h.start()
        h.wait_states({GATEWAY: "ready", "lazy": "stopped"})
        streaming, waiting = threading.Thread(target=stream), threading.Thread(target=queued)
        streaming.start()
        assert first_chunk.wait(120)
        waiting.start()
        page.wait_value("veloxd_gateway_queue_depth", 1, server="lazy")

        mark = h.mark()
        h.write(gateway_yaml({"port": page.port}, {"lazy": {**lazy, "concurrency": 2, "aliases": ["lazier"]}}))
        h.wait_event("config_reloaded", after=mark)
        wait_until(lambda: models(base)["lazy"]["aliases"] == ["lazier"], 60, what="the gateway's new view")
        assert post(base, "/v1/completions", {"model": "lazier", "prompt": "z"})[0] == 200
        assert streaming.is_alive()  # it went by the stream: the second slot of the new limit

        streaming.join(120)
        waiting.join(120)
        assert answers == {"stream": (200, True), "queued": 200}
        page.wait_value("veloxd_gateway_queue_depth", 0, server="lazy")
        h.wait_event("server_idle_unloaded", server="lazy", after=mark)
        assert not h.events("server_starting", server=GATEWAY)[1:]  # live: the gateway was not restarted
    finally:
        h.cleanup()
