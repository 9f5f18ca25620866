"""Eviction over a quantized store through the daemon: veloxd.yaml entries `snapkv_affine` and
`h2o_affine` on the tiny model, started by `veloxd run` with the real `veloxd serve`.

Their workers run through tests/fixtures/batch_recorder.py (the real worker with mlx_lm's batch
moves logged), so the same entries prove that concurrent requests share one batch of the
hybrid's own batch class.
"""

from __future__ import annotations

import http.client
import json
import shlex
import sys
from pathlib import Path
from typing import Any, TypedDict

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import BATCH_PREFIX, BATCH_RECORDER, eos_token_ids, free_port, http_json, wait_until
from veloxd.kv.base import Batchable
from veloxd.kv.factory import cache_class

LOAD_S = 240  # two model loads on two busy CPU cores


class Hybrid(TypedDict):
    """An entry's KV settings: its method, bits and the eviction keys it overrides."""

    method: str
    bits: int
    overrides: dict[str, int]


# Small budgets so the ~300-token prompts really evict.
HYBRIDS: dict[str, Hybrid] = {
    "snap": {"method": "snapkv_affine", "bits": 4, "overrides": {"snapkv_budget": 96, "snapkv_window": 16}},
    "heavy": {"method": "h2o_affine", "bits": 4, "overrides": {"h2o_budget": 96, "h2o_window": 32}},
}
LONG_PROMPT = " ".join(f"item{i} = compute(item{i - 1}, {i})" for i in range(1, 60))


def chat(port: int, content: str) -> tuple[int, Any]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0.0}
    return http_json(f"http://127.0.0.1:{port}/v1/chat/completions", body, timeout=180)


def chat_joining_a_stream(port: int, model_dir: Path) -> tuple[int, Any]:
    """A second chat completion (12 tokens) asked while a first one streams: the first is read up
    to its first token and dropped after the second's reply (the worker stops it: its client is
    gone), its end-of-sequence tokens biased away so the tiny model cannot finish it first. Two
    requests sent at once raced on a loaded machine (the first could end before the second came)."""
    body = {"messages": [{"role": "user", "content": f"a {LONG_PROMPT}"}], "max_tokens": 2000, "stream": True}
    body["logit_bias"] = {str(token): -1e9 for token in eos_token_ids(model_dir)}
    first = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    try:
        first.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        streaming = first.getresponse()
        assert streaming.status == 200
        while not (line := streaming.readline()).startswith(b"data: "):  # keepalives during the prefill
            assert line, "the stream ended before its first token"
        return chat(port, f"b {LONG_PROMPT}")
    finally:
        first.close()


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

            status, reply = chat_joining_a_stream(server["port"], tiny_model)
            assert status == 200 and reply["object"] == "chat.completion", reply
            assert reply["usage"]["completion_tokens"] == 12, reply

            # the worker's stderr reaches the daemon's log through a reader thread: the move that
            # joined the second request may be logged just after the replies
            pid: int = up[name]["pid"]

            def batched_two(p: int = pid) -> bool:  # bound now: B023
                return any(m["rows"] == 2 for m in batches(h, p))

            wait_until(batched_two, 60, what="a batch of 2")
            moves = batches(h, pid)
            single = cache_class(method)
            assert issubclass(single, Batchable), f"{single.__name__} does not batch"
            assert all(m["caches"] == [single.batch_class.__name__] for m in moves), moves
        assert h.stop(timeout=120) == 0
    finally:
        h.cleanup()
