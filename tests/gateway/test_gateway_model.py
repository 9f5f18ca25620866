"""The gateway with real `veloxd serve` workers on the shipped model, driven by the openai package."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fixtures.daemon_harness import DaemonHarness, pid_alive
from tests.gateway.support import GATEWAY, LOAD_S, MODEL, events_after, gateway_yaml, models, real_entry
from tests.support import free_port, http_json, wait_until
from veloxd.checks import gib


def client(port: int, request: pytest.FixtureRequest) -> openai.OpenAI:
    # max_retries=0: a 503 must reach the test, not be retried after Retry-After.
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=LOAD_S)
    request.addfinalizer(api.close)  # its pooled sockets, else a ResourceWarning whenever GC finds them
    return api


def reload(h: DaemonHarness, text: str) -> dict:
    mark = h.mark()
    h.write(text)
    return h.wait_event("config_reloaded", after=mark)


@pytest.mark.slow
def test_one_endpoint_for_every_server(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Names and aliases route; streaming; /v1/models; unknown model 404; three concurrent first requests
    share one on-demand start; idle unload; a worker killed mid-stream is an error and the next request
    succeeds; an alias change applies without restarting anything."""
    h = DaemonHarness(tmp_path, real_worker=True)
    gateway = {"port": free_port()}
    servers = {
        "alpha": real_entry(aliases=["fast"]),
        "beta": real_entry(method="affine", bits=4, port=free_port()),
        "lazy": real_entry(start="on_demand", idle_unload_s=3),
    }
    h.write(gateway_yaml(gateway, servers))
    try:
        h.start()
        h.wait_states({GATEWAY: "ready", "alpha": "ready", "beta": "ready", "lazy": "stopped"}, timeout=LOAD_S)
        api = client(gateway["port"], request)
        hello: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]

        for model, served in (("alpha", "alpha"), ("fast", "alpha"), ("beta", "beta"), (MODEL, None)):
            if served is None:  # alpha, beta and lazy serve the same files: the path is ambiguous, not routed
                with pytest.raises(openai.NotFoundError):
                    api.chat.completions.create(model=model, messages=hello, max_tokens=4)
                continue
            answer = api.chat.completions.create(model=model, messages=hello, max_tokens=4)
            assert answer.model == served and answer.usage is not None and answer.usage.completion_tokens > 0

        chunks = list(
            api.completions.create(
                model="beta",
                prompt="Once upon a time",
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # passed through chunk by chunk
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
        streamed = h.wait_event("gateway_request_finished", server="beta", stream=True)
        assert streamed["status"] == 200 and streamed["tokens_out"] == 12 and streamed["first_byte_s"] is not None

        listed = {m.id: m.to_dict() for m in api.models.list()}  # with the gateway's fields beyond OpenAI's
        assert set(listed) == {"alpha", "beta", "lazy"}
        assert (listed["lazy"]["state"], listed["lazy"]["start"], listed["alpha"]["aliases"]) == (
            "stopped",
            "on_demand",
            ["fast"],
        )
        with pytest.raises(openai.NotFoundError, match="valid models: alpha, beta, lazy"):
            api.completions.create(model="gpt-5", prompt="x", max_tokens=1)

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(
                pool.map(lambda i: api.completions.create(model="lazy", prompt=f"n{i}", max_tokens=3), range(3))
            )
        assert [a.model for a in answers] == ["lazy"] * 3
        assert len(h.events("server_start_requested", server="lazy")) == 1
        assert len(h.events("server_starting", server="lazy")) == 1
        h.wait_event("server_idle_unloaded", server="lazy", timeout=60)
        h.wait_states({"lazy": "stopped"}, timeout=60)

        first = h.server("alpha")["pid"]
        stream = api.completions.create(model="alpha", prompt="Tell me", max_tokens=2000, stream=True)
        seen = 0
        with pytest.raises(openai.APIError, match="stopped mid-stream"):
            for _ in stream:
                seen += 1
                if seen == 3:
                    os.kill(first, signal.SIGKILL)
        # Sent once the daemon saw the exit: a request in the instant before, while the killed process
        # is still being torn down, can be accepted by its listening socket's backlog and reset, a 502
        # by design (the gateway cannot tell it from a request the worker read and died on).
        h.wait_event("server_exited", server="alpha", timeout=60)
        again = api.completions.create(model="alpha", prompt="again", max_tokens=3)  # waits for the restart
        assert again.model == "alpha" and h.server("alpha")["pid"] not in (None, first) and not pid_alive(first)

        pids = h.pids()
        servers["alpha"]["aliases"] = ["quick"]
        plan = reload(h, gateway_yaml(gateway, servers))["plan"]
        assert plan["updated"] == {"alpha": ["aliases"]} and not plan["changed"]
        wait_until(
            lambda: (
                "quick"
                in (http_json(f"http://127.0.0.1:{gateway['port']}/v1/models/quick")[1] or {}).get("aliases", [])
            ),
            30,
            what="the new alias",
        )
        assert api.completions.create(model="quick", prompt="x", max_tokens=2).model == "alpha"
        with pytest.raises(openai.NotFoundError):
            api.completions.create(model="fast", prompt="x", max_tokens=2)
        assert h.pids() == pids  # workers and gateway kept their processes
    finally:
        h.cleanup()


@pytest.mark.slow
def test_memory_admission_with_measured_needs(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A budget that fits one model: the request for the second unloads the idle first. A budget that
    fits neither: 503 naming the need and the budget."""
    h = DaemonHarness(tmp_path, real_worker=True)
    gateway: dict[str, Any] = {"port": free_port(), "memory_budget": "100G"}
    servers = {"one": real_entry(start="on_demand"), "two": real_entry(start="on_demand")}
    h.write(gateway_yaml(gateway, servers))
    try:
        h.start()
        h.wait_states({GATEWAY: "ready"}, timeout=LOAD_S)
        api = client(gateway["port"], request)
        assert api.completions.create(model="one", prompt="x", max_tokens=2).model == "one"
        base = f"http://127.0.0.1:{gateway['port']}"
        # READY measured KV bytes per token and the loaded weights: the need now counts the KV at the context limit.
        need = wait_until(
            lambda: (card := models(base)["two"]) and card["need_bytes"] > 8 * 2**20 and card["need_bytes"],
            30,
            what="the measured need",
        )
        assert models(base)["one"]["need_bytes"] == need  # same model and method: one measurement

        gateway["memory_budget"] = need * 3 // 2
        reload(h, gateway_yaml(gateway, servers))
        wait_until(
            lambda: http_json(base + "/v1/models")[1]["memory_budget_bytes"] == need * 3 // 2, 30, what="the new budget"
        )
        mark = h.mark()
        assert api.completions.create(model="two", prompt="x", max_tokens=2).model == "two"
        unloaded = events_after(h, mark, "server_unloaded", server="one")
        assert unloaded and unloaded[0]["reason"] == "admission" and h.server("one")["state"] == "stopped"

        gateway["memory_budget"] = need // 2
        reload(h, gateway_yaml(gateway, servers))
        wait_until(
            lambda: http_json(base + "/v1/models")[1]["memory_budget_bytes"] == need // 2, 30, what="the smaller budget"
        )
        with pytest.raises(openai.APIStatusError) as refused:
            api.completions.create(model="one", prompt="x", max_tokens=2)
        assert refused.value.status_code == 503
        assert f"needs {gib(need)}" in str(refused.value) and f"memory budget of {gib(need // 2)}" in str(refused.value)
        assert h.wait_event("admission_refused", server="one")["need"] == need
    finally:
        h.cleanup()
