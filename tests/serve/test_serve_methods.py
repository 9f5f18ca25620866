"""Every registered method serves end to end through `veloxd serve` (no crash tier, no fallback),
two concurrent requests in one batch of its own batch cache class."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import Worker, eos_token_ids, free_port, http_json, wait_until
from veloxd.kv import registry
from veloxd.kv.base import Batchable
from veloxd.kv.factory import cache_class

pytestmark = pytest.mark.slow

# Small budgets so eviction really happens on the test prompts (~300 tokens).
SETTINGS = {
    "affine": ["--bits", "4", "--set", "affine_rotate=true"],
    "kivi": ["--bits", "2", "--set", "kivi_residual_length=32"],
    "turboquant_mse": ["--bits", "3"],
    "turboquant_prod": ["--bits", "3"],
    "qjl": ["--bits", "4", "--set", "qjl_sketch_dim=128"],
    "streaming_llm": ["--set", "streaming_llm_sinks=4", "--set", "streaming_llm_window=64"],
    "knorm": ["--set", "knorm_budget=96", "--set", "knorm_window=16"],
    "snapkv": ["--set", "snapkv_budget=96", "--set", "snapkv_window=16"],
    "tova": ["--set", "tova_budget=96"],
    "h2o": ["--set", "h2o_budget=96", "--set", "h2o_window=32"],
}
SETTINGS |= {h.name: ["--bits", "4", *SETTINGS[h.parts[0]]] for h in registry.HYBRIDS}  # eviction over affine codes
# Most slots each evicting layer holds under SETTINGS: its budget plus the decode step's token
# (snapkv: plus its decode window, which it re-compresses after).
HELD_SLOTS = {"streaming_llm": 4 + 64 + 1, "knorm": 96 + 1, "snapkv": 96 + 16, "tova": 96 + 1, "h2o": 96 + 1}
LONG_PROMPT = " ".join(f"item{i} = compute(item{i - 1}, {i})" for i in range(1, 60))


def test_every_compressed_method_has_serve_settings() -> None:
    assert set(SETTINGS) == set(registry.names()) - {"fp16"}


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_method_serves_end_to_end(tiny_model: Path, method: str) -> None:
    info = registry.get(method)
    flags = ("--model", str(tiny_model), "--method", method, "--port", str(free_port()), *SETTINGS[method])
    worker = Worker(*flags, record_batches=True)
    try:
        ready = worker.ready()
        assert ready["method"] == method and ready["storage"] == info.storage
        assert ready["batchable"] is info.batchable
        assert ready["trimmable"] == info.trimmable
        assert "KVCache" not in ready["layer_caches"], "a plain fp16 cache was substituted"
        at_4k = ready["kv_memory"]["at"]["4096"]
        if info.storage == "packed":
            assert at_4k["ratio"] < 0.75, at_4k
        elif method in HELD_SLOTS:
            # capped at the slots an evicting layer holds at most (measured past the budget), over
            # 4096 fp16 tokens (measured at capacity-step multiples): these caches hold no fixed bytes
            assert at_4k["ratio"] == pytest.approx(HELD_SLOTS[method] / 4096, rel=0.03), ready["kv_memory"]
        base = ready["endpoints"]["openai_base_url"]
        # Two requests at once, made to overlap whatever the machine's speed: the first streams a long
        # completion and is read up to its first token; the second is asked while it runs, then the
        # first is dropped (the worker stops it: its client is gone). Its end-of-sequence tokens are
        # biased away, so the tiny model cannot finish it before the second arrives. A method that
        # does not batch serves them one after the other: the first is short then.
        first = http.client.HTTPConnection(urlsplit(base).netloc, timeout=180)
        body = {
            "prompt": f"a {LONG_PROMPT}",
            "max_tokens": 2000 if info.batchable else 12,
            "stream": True,
            "logit_bias": {str(token): -1e9 for token in eos_token_ids(tiny_model)},
        }
        first.request(
            "POST", urlsplit(base).path + "/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        streaming = first.getresponse()
        assert streaming.status == 200
        while not (line := streaming.readline()).startswith(b"data: "):  # keepalives during the prefill
            assert line, "the stream ended before its first token"
        status, reply = http_json(
            f"{base}/completions", {"prompt": f"b {LONG_PROMPT}", "max_tokens": 12, "temperature": 0.0}, timeout=180
        )
        first.close()
        assert status == 200 and reply["usage"]["completion_tokens"] == 12, reply
        assert not any("Traceback" in line for line in worker.stderr), worker.stderr[-30:]
        # mlx_lm's batched path, with this method's batch class in every layer (never fp16's
        # BatchKVCache), held both requests at once; a method that does not batch never enters it
        if not info.batchable:
            assert not worker.batches(), worker.batches()
            return
        # The recorder's lines reach worker.stderr through a drain thread: the batch that took the
        # second request (the newest line) may land after its reply (CI read 5 one-row records).
        batches = wait_until(
            lambda: [b for b in worker.batches() if b["rows"] == 2], 60, what="a batch holding both requests"
        )
        single = cache_class(method)
        assert issubclass(single, Batchable), single
        assert all(b["caches"] == [single.batch_class.__name__] for b in worker.batches()), batches
    finally:
        assert worker.stop() == 0


def test_affine_8bit_and_fp16_agree_on_greedy_tokens(tiny_model: Path) -> None:
    texts: list[str] = []
    for flags in (["--method", "fp16"], ["--method", "affine", "--bits", "8"]):
        worker = Worker("--model", str(tiny_model), "--port", str(free_port()), *flags)
        try:
            base = worker.ready()["endpoints"]["openai_base_url"]
            body = {"prompt": "def add(a, b):", "max_tokens": 16, "temperature": 0.0}
            status, reply = http_json(f"{base}/completions", body)
            assert status == 200
            texts.append(reply["choices"][0]["text"])
        finally:
            worker.stop()
    assert texts[0] == texts[1]
    assert texts[0]
