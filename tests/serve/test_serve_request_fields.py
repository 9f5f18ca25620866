"""Request fields mlx_lm reads unchecked: each wrong one gets a 400 naming it, and the worker lives on.

Before veloxd/serve/request_fields.py, `"stop": 5` killed mlx_lm's generation thread (the worker
exited and, after five such requests, the daemon gave the entry up as FATAL), and the other
fields below were answered with a 404 from deep inside generate().
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Worker, free_port, http_json
from veloxd.protocol import ExitCode
from veloxd.serve import request_fields

SHIPPED = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"
HI = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"

REFUSED: list[tuple[str, dict, str, str]] = [
    (CHAT, {"messages": HI, "stop": 5}, "stop", "stop must be a string or a list of strings, got integer"),
    (CHAT, {"messages": HI, "stop": [5]}, "stop", "stop[0] must be a non-empty string, got integer"),
    (CHAT, {"messages": HI, "stop": [["a"]]}, "stop", "stop[0] must be a non-empty string, got array"),
    (CHAT, {"messages": HI, "stop": ["a", ""]}, "stop", "stop[1] must be a non-empty string, got an empty string"),
    (CHAT, {"messages": HI, "stop": ["x"] * 17}, "stop", "stop holds 17 sequences; at most 16"),
    (CHAT, {"messages": []}, "messages", "messages must be a non-empty list of objects, got an empty list"),
    (CHAT, {"messages": "hi"}, "messages", "messages must be a non-empty list of objects, got string"),
    (CHAT, {"messages": ["hi"]}, "messages[0]", "messages[0] must be an object with a role, got string"),
    (CHAT, {"messages": [{"content": "hi"}]}, "messages[0].role", "messages[0].role must be a string, got null"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "got integer"),
    (CHAT, {"messages": HI, "tools": "x"}, "tools", "tools must be a list of tool objects, got string"),
    (CHAT, {"messages": HI, "chat_template_kwargs": "x"}, "chat_template_kwargs", "must be an object, got string"),
    (CHAT, {"messages": HI, "max_tokens": True}, "max_tokens", "max_tokens must be a number, got boolean"),
    (CHAT, {"messages": HI, "n": 3}, "n", "n must be 1: this server generates one choice per request, got 3"),
    (TEXT, {"prompt": 5}, "prompt", "prompt must be a string (one prompt per request), got integer"),
    (TEXT, {"prompt": ["a", "b"]}, "prompt", "got array"),
    (TEXT, {}, "prompt", "prompt is required"),
    # from an audit: an empty prompt killed the generation thread (the worker exited); an
    # out-of-range seed raised after the prefill and the connection dropped with no answer
    (TEXT, {"prompt": ""}, "prompt", "prompt must not be empty"),
    (TEXT, {"prompt": "hi", "seed": -1}, "seed", "seed must be between 0 and 2^64 - 1, got -1"),
    (CHAT, {"messages": HI, "seed": 2**64}, "seed", "seed must be between 0 and 2^64 - 1"),
    (CHAT, {"messages": HI, "stop": ""}, "stop", "stop must be a non-empty string"),
    (CHAT, {"messages": [{"role": "user"}]}, "messages[0].content", "messages[0].content is required for role user"),
]
ACCEPTED: list[tuple[str, dict]] = [
    (CHAT, {"messages": HI, "stop": None, "n": 1, "tools": None}),
    (CHAT, {"messages": HI, "stop": "\n", "stream_options": {"include_usage": True}}),
    (CHAT, {"messages": [{"role": "assistant", "content": None}, *HI], "stop": ["a", "b"]}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    (TEXT, {"prompt": "hi", "max_tokens": 2, "seed": 3}),
    (TEXT, {"prompt": "hi", "max_tokens": 2, "seed": 2**64 - 1}),
]


@pytest.mark.parametrize(("path", "body", "param", "says"), REFUSED)
def test_each_wrong_field_is_named(path: str, body: dict, param: str, says: str) -> None:
    found = request_fields.problem(path, body)
    assert found is not None and found.param == param and says in found.message, found


@pytest.mark.parametrize(("path", "body"), ACCEPTED)
def test_what_openai_clients_send_passes(path: str, body: dict) -> None:
    assert request_fields.problem(path, body) is None


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    served = Worker("--model", str(SHIPPED), "--method", "fp16", "--port", str(free_port()), "--limit-max-tokens", "3")
    served.ready(300)
    yield served
    assert served.stop() == ExitCode.OK


def post(worker: Worker, path: str, body: dict) -> tuple[int, dict]:
    return http_json(f"http://127.0.0.1:{worker.ready()['port']}{path}", body, timeout=120)


@pytest.mark.slow
def test_requests_that_killed_the_generation_thread_get_400_and_the_worker_serves_on(worker: Worker) -> None:
    for path, body, param, says in REFUSED:
        status, payload = post(worker, path, body)
        assert status == 400, (body, payload)
        assert payload["error"]["param"] == param and says in payload["error"]["message"], payload
        assert payload["error"]["type"] == "invalid_request_error"
    status, payload = post(worker, CHAT, {"messages": HI, "stop": ["zz"], "max_tokens": 2})
    assert status == 200 and payload["choices"][0]["message"]["role"] == "assistant", payload
    assert worker.proc.poll() is None
    assert not [line for line in list(worker.stderr) if "Traceback" in line]


@pytest.mark.slow
def test_a_prompt_mlx_lm_cannot_build_is_a_400_not_a_404(worker: Worker) -> None:
    """Content parts mlx_lm cannot turn into text fail inside generate(), which mlx_lm answers with 404."""
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    status, payload = post(worker, CHAT, {"messages": image})
    assert status == 400, payload
    assert payload["error"]["type"] == "invalid_request_error", payload
    status, payload = post(worker, CHAT, {"messages": HI, "max_tokens": 2})
    assert status == 200, payload


@pytest.mark.slow
def test_an_unsupported_method_is_answered_in_the_openai_error_shape(worker: Worker) -> None:
    with socket.create_connection(("127.0.0.1", worker.ready()["port"]), timeout=120) as sock:
        sock.sendall(b"PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].endswith(b"501 Unsupported method ('PUT')"), head
    assert b"application/json" in head
    assert json.loads(body)["error"]["message"] == "Unsupported method ('PUT')"
