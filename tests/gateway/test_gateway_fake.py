"""The gateway process under a real daemon, in front of stand-in workers (tests/fixtures/fake_worker.py).

Fast: no model loads. Proves routing, auth, limits, live reloads, on-demand starts, idle unloads,
admission and a worker dying mid-stream with real processes and sockets; the same flows with the
real model are in test_gateway_model.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fixtures.daemon_harness import DaemonHarness, pid_alive
from tests.gateway.support import (
    GATEWAY,
    events_after,
    fake_entry,
    gateway_yaml,
    model_dir,
    models,
    post,
    wait_model_state,
)
from tests.support import free_port, http_json, run_veloxd, wait_until
from veloxd.config.gateway import ASSIGNED_PORTS
from veloxd.daemon.longpoll import MAX_WAIT_S
from veloxd.gateway.events import BATCH_S


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    h = DaemonHarness(tmp_path)
    yield h
    h.cleanup()


def _ts(record: dict) -> float:
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


def _reload(h: DaemonHarness, text: str) -> dict:
    mark = h.mark()
    h.write(text)
    return h.wait_event("config_reloaded", after=mark)


def test_routing_limits_auth_and_live_changes_without_restarts(harness: DaemonHarness, tmp_path: Path) -> None:
    h = harness
    alpha, beta = model_dir(tmp_path, "alpha-model"), model_dir(tmp_path, "beta-model")
    gateway: dict[str, Any] = {"port": free_port(), "max_body_bytes": 2000}
    servers = {"alpha": fake_entry(alpha, aliases=["fast"], assigned_port=True), "beta": fake_entry(beta)}
    h.write(gateway_yaml(gateway, servers))
    h.start(env={"GW_KEY": "s3cret"})
    h.wait_states({GATEWAY: "ready", "alpha": "ready", "beta": "ready"})
    base = f"http://127.0.0.1:{gateway['port']}"
    assert ASSIGNED_PORTS[0] <= h.server("alpha")["port"] <= ASSIGNED_PORTS[1]  # no port in its entry

    for model, server in (
        ("alpha", "alpha"),
        ("fast", "alpha"),
        ("beta", "beta"),
        ("beta-model", "beta"),
        (str(beta), "beta"),
    ):
        status, body = post(base, "/v1/completions", {"model": model, "prompt": "x"})
        assert (status, body["model"], body["pid"]) == (200, server, h.server(server)["pid"]), model
    cards = models(base)
    assert set(cards) == {"alpha", "beta"}
    assert (cards["alpha"]["aliases"], cards["alpha"]["state"], cards["alpha"]["start"]) == (
        ["fast"],
        "ready",
        "always",
    )

    status, body = post(base, "/v1/chat/completions", {"model": "nope", "messages": []})
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["valid"] == ["alpha", "beta"]
    assert body["error"]["message"] == "model 'nope' not found; valid models: alpha, beta (aliases: fast)"
    assert post(base, "/v1/completions", {"prompt": "no model"})[0] == 400
    assert post(base, "/v1/completions", b"{not json")[0] == 400
    status, body = post(base, "/v1/completions", {"model": "alpha", "prompt": "x" * 3000})
    assert status == 413 and "2000" in body["error"]["message"]

    h.wait_event("gateway_request_finished", status=413)  # the gateway writes its events in batches: wait for the last
    requests = events_after(h, 0, "gateway_request_finished")
    assert {(r["model"], r["server"], r["status"]) for r in requests} >= {("fast", "alpha", 200), ("nope", None, 404)}
    assert all(r["latency_s"] is not None and r["queued_s"] is not None for r in requests)

    pids = h.pids()
    servers["alpha"]["aliases"] = ["quick"]
    gateway.update(api_key_env="GW_KEY", max_body_bytes=10_000)
    reloaded = _reload(h, gateway_yaml(gateway, servers))
    assert set(reloaded["plan"]["updated"]) == {"alpha", GATEWAY} and not reloaded["plan"]["changed"]
    token = {"Authorization": "Bearer s3cret"}
    wait_until(
        lambda: post(base, "/v1/completions", {"model": "quick", "prompt": "x"}, token)[0] == 200,
        30,
        what="the new alias routed",
    )
    assert post(base, "/v1/completions", {"model": "fast", "prompt": "x"}, token)[0] == 404
    assert post(base, "/v1/completions", {"model": "alpha", "prompt": "x" * 3000}, token)[0] == 200
    status, body = post(base, "/v1/completions", {"model": "quick", "prompt": "x"})
    assert status == 401 and body["_headers"]["WWW-Authenticate"] == "Bearer"
    assert post(base, "/v1/completions", {"model": "quick", "prompt": "x"}, {"Authorization": "Bearer nope"})[0] == 401
    assert (
        post(base, "/v1/completions", {"model": "quick", "prompt": "x"}, {"Authorization": "bEaReR s3cret"})[0] == 200
    )
    assert http_json(base + "/health")[0] == 200  # open: the daemon's probe needs no token
    assert http_json(base + "/v1/models")[0] == 401
    assert h.pids() == pids  # neither the gateway nor a worker restarted


def slow_streamer(h: DaemonHarness, root: Path, chunks: int, delay_s: float) -> dict[str, int]:
    """Start the gateway in front of one stand-in server `alpha` that streams `chunks` chunks
    `delay_s` apart; both ready. Returns the gateway's block (its port)."""
    gateway = {"port": free_port()}
    slow = {"FAKE_STREAM_CHUNKS": str(chunks), "FAKE_CHUNK_DELAY_S": str(delay_s)}
    h.write(gateway_yaml(gateway, {"alpha": fake_entry(model_dir(root, "m"), port=free_port(), env=slow)}))
    h.start()
    h.wait_states({GATEWAY: "ready", "alpha": "ready"})
    return gateway


def test_streams_pass_through_and_a_worker_killed_mid_stream_is_an_error(
    harness: DaemonHarness, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    h = harness
    gateway = slow_streamer(h, tmp_path, chunks=200, delay_s=0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway['port']}/v1", api_key="unused", max_retries=0)
    request.addfinalizer(client.close)  # its pooled sockets, else a ResourceWarning whenever GC finds them

    first = h.server("alpha")["pid"]
    stream = client.completions.create(model="alpha", prompt="x", stream=True)
    texts = []
    with pytest.raises(openai.APIError, match="stopped mid-stream"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
            if len(texts) == 3:
                os.kill(first, signal.SIGKILL)
    assert texts[:3] == ["t0", "t1", "t2"] and len(texts) < 200
    # The next request waits for the daemon's restart of the worker and succeeds.
    answer = client.completions.create(model="alpha", prompt="x")
    assert answer.choices[0].text == "ok" and h.server("alpha")["pid"] not in (None, first)
    failed = h.wait_event("gateway_request_finished", status=502)
    assert failed["server"] == "alpha" and failed["stream"] is True and "before [DONE]" in failed["error"]


def test_on_demand_start_is_shared_and_idle_servers_unload(harness: DaemonHarness, tmp_path: Path) -> None:
    h = harness
    gateway = {"port": free_port()}
    lazy = fake_entry(
        model_dir(tmp_path, "m"),
        port=free_port(),
        start="on_demand",
        idle_unload_s=1.5,
        env={"FAKE_START_DELAY_S": "1"},
    )
    h.write(gateway_yaml(gateway, {"lazy": lazy}))
    h.start()
    h.wait_states({GATEWAY: "ready", "lazy": "stopped"})
    base = f"http://127.0.0.1:{gateway['port']}"
    assert models(base)["lazy"]["state"] == "stopped"

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: post(base, "/v1/completions", {"model": "lazy", "prompt": "x"}), range(3)))
    assert [status for status, _ in answers] == [200, 200, 200]
    assert len({body["pid"] for _, body in answers}) == 1
    assert len(h.events("server_start_requested", server="lazy")) == 1
    assert len(h.events("server_starting", server="lazy")) == 1

    unloaded = h.wait_event("server_idle_unloaded", server="lazy", timeout=60)
    last_request = max(_ts(r) for r in h.events("gateway_request_finished", server="lazy"))
    # Not before idle_unload_s without requests. The unload is logged as the gateway asks for it (at
    # its deadline); the request's event up to BATCH_S later than the request ended (batched lines).
    assert _ts(unloaded) - last_request >= 1.5 - BATCH_S - 0.1
    h.wait_states({"lazy": "stopped"})

    mark = h.mark()
    status, _ = post(base, "/v1/completions", {"model": "lazy", "prompt": "again"})
    assert status == 200 and events_after(h, mark, "server_start_requested", server="lazy")

    gateway_pid = h.server(GATEWAY)["pid"]
    added = fake_entry(model_dir(tmp_path, "m2"), port=free_port(), start="on_demand")
    _reload(h, gateway_yaml(gateway, {"lazy": lazy, "added": added}))
    wait_model_state(base, "added", "stopped")
    assert not h.events("server_starting", server="added") and h.server(GATEWAY)["pid"] == gateway_pid


def test_admission_unloads_the_idle_server_or_refuses_with_the_numbers(harness: DaemonHarness, tmp_path: Path) -> None:
    h = harness
    gateway = {"port": free_port(), "memory_budget": 1_500_000}
    one = fake_entry(model_dir(tmp_path, "one", weights_bytes=1_000_000), port=free_port(), start="on_demand")
    two = fake_entry(model_dir(tmp_path, "two", weights_bytes=1_000_000), port=free_port(), start="on_demand")
    h.write(gateway_yaml(gateway, {"one": one, "two": two}))
    h.start()
    h.wait_states({GATEWAY: "ready"})
    base = f"http://127.0.0.1:{gateway['port']}"
    assert models(base)["one"]["need_bytes"] == 1_000_000  # weights on disk; the stand-in measures no KV

    assert post(base, "/v1/completions", {"model": "one", "prompt": "x"})[0] == 200
    first = h.server("one")["pid"]
    status, body = post(base, "/v1/completions", {"model": "two", "prompt": "x"})
    assert status == 200 and body["model"] == "two"
    unloaded = h.wait_event("server_unloaded", server="one")
    assert unloaded["reason"] == "admission" and unloaded["for_server"] == "two"
    assert h.server("one")["state"] == "stopped" and not pid_alive(first)
    state = h.state()
    assert state["memory"]["budget"] == 1_500_000 and state["memory"]["in_use"] == 1_000_000
    status_text = h.cli("status").stdout
    assert "memory: budget" in status_text and "on_demand" in status_text

    gateway_pid = h.server(GATEWAY)["pid"]
    gateway["memory_budget"] = 500_000
    _reload(h, gateway_yaml(gateway, {"one": one, "two": two}))
    wait_until(
        lambda: http_json(base + "/v1/models")[1]["memory_budget_bytes"] == 500_000,
        30,
        what="the gateway sees the smaller budget",
    )
    status, body = post(base, "/v1/completions", {"model": "one", "prompt": "x"})
    error = body["error"]
    assert status == 503 and error["code"] == "server_unavailable"
    assert (error["need"], error["budget"]) == (1_000_000, 500_000)
    assert "needs 976.6 KiB" in error["message"] and "memory budget of 488.3 KiB" in error["message"]
    event = h.wait_event("admission_refused", server="one")
    assert (event["need"], event["budget"]) == (1_000_000, 500_000)
    assert h.server(GATEWAY)["pid"] == gateway_pid  # the budget applied without restarting the gateway


def stream_request(port: int) -> urllib.request.Request:
    """A streamed completion for `alpha` through the gateway on `port`."""
    return urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"model": "alpha", "prompt": "x", "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )


def test_client_disconnect_cancels_the_upstream_request(harness: DaemonHarness, tmp_path: Path) -> None:
    h = harness
    gateway = slow_streamer(h, tmp_path, chunks=400, delay_s=0.02)
    with urllib.request.urlopen(stream_request(gateway["port"]), timeout=30) as response:
        assert response.readline().startswith(b"data: ")
    record = h.wait_event("gateway_request_finished", server="alpha", timeout=30)
    assert record["status"] == 499 and record["error"] == "client disconnected"


def test_a_client_leaving_right_after_done_is_a_whole_answer(harness: DaemonHarness, tmp_path: Path) -> None:
    """The openai package closes its connection on `data: [DONE]`, often before the worker closes its own."""
    h = harness
    gateway = {"port": free_port()}
    lingering = {"FAKE_LINGER_S": "5"}
    h.write(gateway_yaml(gateway, {"alpha": fake_entry(model_dir(tmp_path, "m"), port=free_port(), env=lingering)}))
    h.start()
    h.wait_states({GATEWAY: "ready", "alpha": "ready"})
    with urllib.request.urlopen(stream_request(gateway["port"]), timeout=30) as response:
        lines = iter(response.readline, b"")
        assert any(line.startswith(b"data: [DONE]") for line in lines)
    record = h.wait_event("gateway_request_finished", server="alpha", timeout=30)
    assert (record["status"], record["error"], record["tokens_out"]) == (200, None, 8)


def test_always_servers_over_budget_are_reported_by_check_plan_and_the_daemon(
    harness: DaemonHarness, tmp_path: Path
) -> None:
    h = harness
    gateway = {"port": free_port(), "memory_budget": 1_500_000}
    servers = {
        name: fake_entry(model_dir(tmp_path, name, weights_bytes=1_000_000), port=free_port())
        for name in ("first", "second")
    }
    h.write(gateway_yaml(gateway, servers))
    check = run_veloxd("check", str(h.config))
    assert check.returncode == 0 and "over budget from: second" in check.stderr
    plan = h.cli("plan", str(h.config))
    assert plan.returncode == 0 and "memory: budget 1.4 MiB (gateway.memory_budget)" in plan.stdout
    assert "first   always" in plan.stdout and "warning: servers with start: always do not fit" in plan.stdout
    h.start()
    event = h.wait_event("memory_overcommitted")
    assert event["servers"] == ["second"] and event["budget"] == 1_500_000
    h.wait_states({"first": "ready", "second": "ready"})  # reported, not refused: `always` means always


def test_a_request_for_a_waiting_server_is_told_why_and_the_server_heals(
    harness: DaemonHarness, tmp_path: Path
) -> None:
    """Its port taken: a 503 naming the port (not a request held until the start times out), and once
    the port is free the server starts and answers."""
    import socket

    h = harness
    gateway = {"port": free_port()}
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    try:
        lazy = fake_entry(model_dir(tmp_path, "m"), port=port, start="on_demand")
        h.write(gateway_yaml(gateway, {"lazy": lazy}))
        h.start()
        h.wait_states({GATEWAY: "ready", "lazy": "stopped"})
        base = f"http://127.0.0.1:{gateway['port']}"
        # the first request starts it and waits for it; the daemon finds the port taken. It is told at
        # once: a request that only the long poll's deadline woke would take MAX_WAIT_S.
        status, body = post(base, "/v1/completions", {"model": "lazy", "prompt": "x"}, timeout=MAX_WAIT_S - 5)
        assert status == 503, body
        assert "waiting" in body["error"]["message"] and str(port) in body["error"]["message"]
        h.wait_states({"lazy": "waiting"})
        status, body = post(base, "/v1/completions", {"model": "lazy", "prompt": "x"}, timeout=120)
        assert status == 503 and str(port) in body["error"]["message"]
    finally:
        squatter.close()
    h.wait_states({"lazy": "ready"}, timeout=120)  # the condition cleared: the requested start goes on
    status, body = post(base, "/v1/completions", {"model": "lazy", "prompt": "x"})
    assert status == 200, body
