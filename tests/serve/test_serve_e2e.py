"""End to end: a real `veloxd serve` process on loopback, spoken to over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Worker, free_port, http_json, veloxd_cmd, wait_until

pytestmark = pytest.mark.slow

PROMPT = "def fibonacci(n): return"


def fp16_flags(model: Path) -> list[str]:
    """`veloxd serve` flags of the plain worker most tests use: the model in fp16 on a free port."""
    return ["--model", str(model), "--method", "fp16", "--port", str(free_port())]


@pytest.fixture(scope="module")
def fp16_worker(tiny_model: Path) -> Iterator[Worker]:
    worker = Worker(*fp16_flags(tiny_model), "--max-tokens", "12")
    worker.ready()
    yield worker
    assert worker.stop() == 0


def chat(base: str, content: str = "hello", **extra: Any) -> tuple[int, dict]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0.0, **extra}
    return http_json(f"{base}/chat/completions", body)


def test_ready_line_describes_the_server(fp16_worker: Worker, tiny_model: Path) -> None:
    payload = fp16_worker.ready()
    assert payload["schema_version"] == 1
    assert payload["model"] == str(tiny_model.resolve())
    assert payload["method"] == "fp16" and payload["storage"] == "fp16"
    assert payload["pid"] == fp16_worker.proc.pid
    assert payload["layer_caches"] == {"KVCache": 2}
    assert payload["batchable"] is True and payload["trimmable"] == "yes"
    memory = payload["kv_memory"]
    assert all(row["ratio"] == 1.0 and row["fp16"] > 0 for row in memory["at"].values())
    assert memory["bytes_per_token"]["fp16"] > 0 and memory["max_context"] == 8192
    assert set(payload["endpoints"]) == {"openai_base_url", "chat_completions", "completions", "models", "health"}
    ready_lines = [line for line in fp16_worker.stdout if line.startswith("VELOXD_READY ")]
    assert len(ready_lines) == 1


def test_health_models_and_chat(fp16_worker: Worker, tiny_model: Path) -> None:
    endpoints = fp16_worker.ready()["endpoints"]
    assert http_json(endpoints["health"]) == (200, {"status": "ok"})
    status, models = http_json(endpoints["models"])
    assert status == 200
    assert [m["id"] for m in models["data"]] == [str(tiny_model.resolve())]
    status, reply = chat(endpoints["openai_base_url"])
    assert status == 200
    assert reply["object"] == "chat.completion"
    assert reply["model"] == str(tiny_model.resolve())
    assert reply["usage"]["completion_tokens"] == 8
    assert isinstance(reply["choices"][0]["message"]["content"], str)


def test_streamed_completion_arrives_as_server_sent_events(fp16_worker: Worker) -> None:
    url = fp16_worker.ready()["endpoints"]["completions"]
    body = json.dumps({"prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "stream": True}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_two_concurrent_requests_both_complete(fp16_worker: Worker) -> None:
    base = fp16_worker.ready()["endpoints"]["openai_base_url"]
    results: list[tuple[int, dict]] = []
    threads = [threading.Thread(target=lambda c=c: results.append(chat(base, c))) for c in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(status for status, _ in results) == [200, 200]
    assert all(reply["usage"]["completion_tokens"] == 8 for _, reply in results)


def test_a_request_for_another_model_is_refused_not_loaded(fp16_worker: Worker) -> None:
    base = fp16_worker.ready()["endpoints"]["openai_base_url"]
    status, reply = chat(base, model="mlx-community/some-other-model")
    assert status == 404
    assert reply["error"]["code"] == "model_not_found"
    status, _ = chat(base, draft_model="mlx-community/draft")
    assert status == 404
    assert http_json(f"{base[:-3]}/health")[0] == 200  # still serving


def test_sigterm_stops_cleanly(tiny_model: Path) -> None:
    worker = Worker(*fp16_flags(tiny_model))
    worker.ready()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(120) == 0
    worker.join_output()


def test_lifeline_eof_makes_the_worker_exit(tiny_model: Path) -> None:
    """The daemon's pipe closing (the daemon died) ends the worker, with exit code 0."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        veloxd_cmd("serve", *fp16_flags(tiny_model), "--lifeline-fd", str(read_fd)),
        pass_fds=(read_fd,),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    os.close(read_fd)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("VELOXD_READY ")
    os.close(write_fd)
    assert proc.wait(120) == 0
    proc.stdout.close()


def test_bearer_auth_guards_everything_but_health(tiny_model: Path) -> None:
    env = {"VELOXD_TEST_KEY": "s3cret-token"}
    worker = Worker(*fp16_flags(tiny_model), "--api-key-env", "VELOXD_TEST_KEY", env=env)
    try:
        endpoints = worker.ready()["endpoints"]
        assert worker.ready()["auth"] is True
        assert http_json(endpoints["health"])[0] == 200
        assert http_json(endpoints["models"])[0] == 401
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert http_json(endpoints["chat_completions"], body)[0] == 401
        wrong = {"Authorization": "Bearer nope"}
        assert http_json(endpoints["chat_completions"], body, headers=wrong)[0] == 401
        right = {"Authorization": "Bearer s3cret-token"}
        assert http_json(endpoints["chat_completions"], body, headers=right)[0] == 200
        assert all("s3cret-token" not in line for line in worker.stdout + worker.stderr)
    finally:
        worker.stop()


def test_unservable_model_type_exits_2_without_serving(tmp_path: Path, tiny_model: Path) -> None:
    """A model whose attention calls MLX's fused kernel directly is refused by name."""
    model = tmp_path / "fused"
    model.mkdir()
    for item in tiny_model.iterdir():
        (model / item.name).write_bytes(item.read_bytes())
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "plamo2"  # mlx_lm's plamo2 calls mx.fast.scaled_dot_product_attention
    (model / "config.json").write_text(json.dumps(config))
    worker = Worker("--model", str(model), "--method", "affine", "--port", str(free_port()))
    assert worker.proc.wait(120) == 2
    worker.join_output()
    wait_until(lambda: any("model type 'plamo2'" in line for line in worker.stderr), 120, what="refusal message")
    assert any("mlx_lm.models.plamo2" in line for line in worker.stderr)
    assert not any(line.startswith("VELOXD_READY") for line in worker.stdout)
