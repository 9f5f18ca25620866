"""Eviction over a quantized store through the daemon: veloxd.yaml entries `snapkv_affine` and
`h2o_affine` on the tiny model, started by `veloxd run` with the real `veloxd serve`.

Their workers run through tests/fixtures/batch_recorder.py (the real worker with mlx_lm's batch
moves logged), so the same entries prove that concurrent requests share one batch of the
hybrid's own batch class.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import BATCH_PREFIX, BATCH_RECORDER, free_port, http_json, wait_until
from veloxd.kv.factory import cache_class

LOAD_S = 240  # two model loads on two busy CPU cores
# Small budgets so the ~300-token prompts really evict.
HYBRIDS = {
    "snap": {"method": "snapkv_affine", "bits": 4, "overrides": {"snapkv_budget": 96, "snapkv_window": 16}},
    "heavy": {"method": "h2o_affine", "bits": 4, "overrides": {"h2o_budget": 96, "h2o_window": 32}},
}
LONG_PROMPT = " ".join(f"item{i} = compute(item{i - 1}, {i})" for i in range(1, 60))


def chat(port: int, content: str) -> tuple[int, Any]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0.0}
    return http_json(f"http://127.0.0.1:{port}/v1/chat/completions", body, timeout=180)


def chat_twice_at_once(port: int) -> list[tuple[int, Any]]:
    """Two chat completions sent together (distinct prompts), as (status, reply) pairs."""
    results: list[tuple[int, Any]] = []
    threads = [
        threading.Thread(target=lambda t=tag: results.append(chat(port, f"{t} {LONG_PROMPT}"))) for tag in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    return results


def batches(h: DaemonHarness, pid: int) -> list[dict[str, Any]]:
    """The batch moves the worker `pid` logged on stderr (server_output records of the daemon)."""
    lines = [r["line"] for r in h.events("server_output", pid=pid, stream="stderr")]
    return [json.loads(line[len(BATCH_PREFIX) :]) for line in lines if line.startswith(BATCH_PREFIX)]


@pytest.mark.slow
def test_hybrid_entries_serve_and_batch_through_the_daemon(tmp_path: Path, tiny_model: Path) -> None:
    h = DaemonHarness(tmp_path, real_worker=True)
    h.worker_command = f"{shlex.quote(sys.executable)} {shlex.quote(str(BATCH_RECORDER))} serve"
    servers = {
        name: entry(free_port(), model=str(tiny_model), ready_timeout_s=LOAD_S, stop_timeout_s=30, **body)
        for name, body in HYBRIDS.items()
    }
    h.write(servers)
    try:
        h.start()
        up = h.wait_states(dict.fromkeys(servers, "ready"), timeout=LOAD_S)
        for name, server in servers.items():
            method = server["method"]
            ready = up[name]["ready"]  # the state document keeps the READY line
            assert ready["method"] == method and ready["bits"] == 4 and ready["storage"] == "packed"
            assert ready["layer_caches"] == {cache_class(method).__name__: 2}, ready["layer_caches"]
            assert all(ready["config"][k] == v for k, v in server["overrides"].items()), ready["config"]
            memory = ready["kv_memory"]
            assert memory["bytes_per_token"]["fp16"] > 0 and 0 < memory["at"]["4096"]["ratio"] < 0.1, memory
            logged = h.events("server_ready", server=name)[-1]["ready"]
            assert logged["kv_memory"] == memory

            results = chat_twice_at_once(server["port"])
            assert [status for status, _ in results] == [200, 200], results
            assert all(reply["usage"]["completion_tokens"] == 12 for _, reply in results), results
            assert all(reply["object"] == "chat.completion" for _, reply in results)

            # the worker's stderr reaches the daemon's log through a reader thread: the move that
            # joined the second request may be logged just after the replies
            pid = up[name]["pid"]
            wait_until(lambda p=pid: any(m["rows"] == 2 for m in batches(h, p)), 60, what="a batch of 2")
            moves = batches(h, pid)
            assert all(m["caches"] == [cache_class(method).batch_class.__name__] for m in moves), moves
        assert h.stop(timeout=120) == 0
    finally:
        h.cleanup()
