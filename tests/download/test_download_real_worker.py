"""End to end with a real `veloxd serve`: the daemon downloads the shipped tiny model from the hub
stand-in, then the worker loads it from the cache offline and answers a completion."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.download.conftest import MODEL
from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.fixtures.hub_standin import HubStandIn
from tests.support import free_port, http_json

LOAD_S = 240  # a download plus a model load on two busy CPU cores


@pytest.mark.slow
def test_daemon_downloads_then_a_real_worker_serves_the_model(
    hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path
) -> None:
    h = DaemonHarness(tmp_path, real_worker=True)
    port = free_port()
    h.write({"tiny": entry(port, model=MODEL, method="fp16", ready_timeout_s=LOAD_S)})
    try:
        h.start(env=hub_env)
        h.wait_states({"tiny": "ready"}, timeout=LOAD_S)
        served = hub.served_bytes(MODEL)
        requests = len(hub.requests)
        status, reply = http_json(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
            timeout=120,
        )
        assert status == 200 and reply["choices"][0]["message"]["content"] is not None

        mark = h.mark()
        assert h.cli("restart", "tiny").returncode == 0  # complete in the cache now: no download phase
        h.wait_event("server_ready", after=mark, timeout=LOAD_S, server="tiny")
        assert not [r for r in h.records()[mark:] if r["event"] == "server_downloading"]
    finally:
        h.stop(timeout=60)
        h.cleanup()
    ready = h.events("server_ready", server="tiny")[0]
    assert ready["ready"]["model"] == MODEL
    assert hub.served_bytes(MODEL) == served and len(hub.requests) == requests  # the worker never asked the hub
    # ...not even on its first load: the one revision lookup is the download step's (workers run offline).
    assert hub.requests.count(("GET", f"/api/models/{MODEL}/revision/main")) == 1
