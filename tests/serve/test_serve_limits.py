"""Bounded work per request, against a real `veloxd serve` on the shipped model.

Each test reproduces one way a client could make the worker work (or wait) without bound: huge
max_tokens, a prompt longer than the context, a client that leaves mid-generation (streamed or
not), a body that never arrives, and a SIGTERM in the middle of a generation.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Worker, free_port, http_json, wait_until
from veloxd.protocol import ExitCode
from veloxd.serve.stats import STATS_PATH

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"
CONTEXT = json.loads((SHIPPED / "config.json").read_text())["max_position_embeddings"]
UNBOUNDED = "10000000"  # a cap no test reaches: without the fixes these requests would run for hours
LOAD_S = 300


def start(*flags: str, record_batches: bool = False) -> Worker:
    worker = Worker(
        "--model", str(SHIPPED), "--method", "fp16", "--port", str(free_port()), *flags, record_batches=record_batches
    )
    worker.ready(LOAD_S)
    return worker


@pytest.fixture(scope="module")
def bounded() -> Iterator[Worker]:
    worker = start("--limit-max-tokens", "6", "--request-body-timeout", "2")
    yield worker
    assert worker.stop() == ExitCode.OK


@pytest.fixture(scope="module")
def unbounded() -> Iterator[Worker]:
    """Records mlx_lm's batch moves: they show whether a cancelled generation is still in the batch."""
    worker = start("--limit-max-tokens", UNBOUNDED, record_batches=True)
    yield worker
    assert worker.stop() == ExitCode.OK


def raw_request(port: int, path: str, body: dict) -> socket.socket:
    """POST `body` on a socket the test can close whenever it likes."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout bounds each read)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def lines_with(worker: Worker, needle: str) -> list[str]:
    return [line for line in list(worker.stderr) if needle in line]


def stats(worker: Worker) -> dict:
    status, reply = http_json(f"http://127.0.0.1:{worker.ready()['port']}{STATS_PATH}", timeout=60)
    assert status == 200, reply
    return reply


def test_ready_reports_the_effective_limits(bounded: Worker, unbounded: Worker) -> None:
    limits = bounded.ready()["limits"]
    assert limits == {
        "max_tokens": 6,
        "max_prompt_tokens": CONTEXT,
        "context_length": CONTEXT,
        "body_timeout_s": 2.0,
        "max_body_bytes": 32 * 2**20,
    }
    assert unbounded.ready()["limits"]["max_tokens"] == int(UNBOUNDED)


def test_huge_max_tokens_is_capped_to_the_limit(bounded: Worker) -> None:
    base = bounded.ready()["endpoints"]["openai_base_url"]
    status, reply = http_json(f"{base}/completions", {"prompt": "hello", "max_tokens": 1_000_000_000})
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] == 6 and reply["choices"][0]["finish_reason"] == "length"
    # the worker's stderr is read by a thread: the event may land just after the reply
    wait_until(lambda: lines_with(bounded, "max_tokens_capped requested=1000000000 limit=6"), 60, what="the event")


def test_prompt_longer_than_the_context_gets_400_naming_both_numbers(bounded: Worker) -> None:
    base = bounded.ready()["endpoints"]["openai_base_url"]
    prompt = "hello world " * (CONTEXT * 2)  # about 2 tokens a repeat: several times the context
    status, reply = http_json(f"{base}/completions", {"prompt": prompt, "max_tokens": 1})
    assert status == 400
    message = reply["error"]["message"]
    count = int(message.split()[2])
    assert count > CONTEXT and f"at most {CONTEXT}" in message, message
    assert reply["error"]["code"] == "context_length_exceeded"
    refusal = wait_until(
        lambda: lines_with(bounded, f"request_refused reason=prompt_too_long prompt_tokens={count}"),
        60,
        what="the event",
    )
    assert f"prompt_tokens={count} max_prompt_tokens={CONTEXT}" in refusal[-1]
    assert not lines_with(bounded, f"Prompt processing progress: {count}")  # refused before any prefill
    assert not lines_with(bounded, "Token indices sequence length")  # transformers' warning: noise beside the 400
    status, reply = http_json(
        f"{base}/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    )
    assert status == 400 and f"at most {CONTEXT}" in reply["error"]["message"]


def test_a_body_that_never_arrives_is_timed_out_and_closed(bounded: Worker) -> None:
    port = bounded.ready()["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}")
        answer = read_all(sock)  # returns only once the server closes the connection
    assert answer.startswith(b"HTTP/1.0 408"), answer[:200]
    assert b"2 of 100 bytes arrived" in answer


def test_a_huge_content_length_is_refused_before_reading(bounded: Worker) -> None:
    port = bounded.ready()["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{}")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.0 413"), answer[:200]
    assert b"999999999 bytes exceeds this server's limit of 33554432 bytes" in answer


def test_a_slow_header_sender_is_cut_off(bounded: Worker) -> None:
    port = bounded.ready()["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert read_all(sock) == b""  # closed by the server, not by this test


def test_headers_dripping_a_byte_at_a_time_are_cut_off_in_total(bounded: Worker) -> None:
    """Each byte comes well within the per-read timeout (2 s), so only a total limit on the headers
    can end this: the connection is closed long before the 200-byte header is complete."""
    port = bounded.ready()["port"]
    header = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 150 + b"\r\n\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        for byte in header:
            if select.select([sock], [], [], 0)[0] and sock.recv(1, socket.MSG_PEEK) == b"":
                break  # the server closed its end
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # reset by the server
                break
            sent += 1
            time.sleep(0.25)  # pacing of the attack, not a threshold: no assertion reads the clock
    assert sent < len(header), "the server kept reading a header dripping in for its whole length"


def _reset(port: int, payload: bytes) -> None:
    """Send `payload`, then close with a TCP reset: the worker's answer meets a connection that is gone."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(payload)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_clients_that_vanish_leave_no_traceback(bounded: Worker) -> None:
    port = bounded.ready()["port"]
    before = len(lines_with(bounded, "request_too_large"))
    for _ in range(20):
        _reset(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        _reset(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    wait_until(lambda: len(lines_with(bounded, "request_too_large")) >= before + 20, 120, what="every refusal answered")
    status, _ = http_json(f"http://127.0.0.1:{port}/health", timeout=60)
    assert status == 200
    assert not lines_with(bounded, "Traceback") and not lines_with(bounded, "ConnectionResetError")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'\xff\xfe{"messages": []}', "request body is not UTF-8: byte 0xff at offset 0"),
        (b'{"messages": ', "request body is not valid JSON: Expecting value"),
        (b"[1, 2]", "request body must be a JSON object, got list"),
        (
            b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "messages[0].content holds a lone UTF-16 surrogate",
        ),
    ],
    ids=["not-utf8", "not-json", "not-object", "lone-surrogate"],
)
def test_malformed_bodies_get_a_400_json_error_and_no_traceback(bounded: Worker, body: bytes, says: str) -> None:
    port = bounded.ready()["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = read_all(sock)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400"), answer[:300]
    error = json.loads(payload)["error"]
    assert says in error["message"] and error["code"] == "invalid_request_error"
    assert not lines_with(bounded, "Traceback")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
def test_client_that_disconnects_stops_the_generation(unbounded: Worker, stream: bool) -> None:
    ready = unbounded.ready()
    assert ready["batchable"], "the batch moves below prove nothing on mlx_lm's single-request path"
    before = len(lines_with(unbounded, "request_cancelled"))
    generated, started = stats(unbounded)["generated_tokens"], len(unbounded.batches())
    sock = raw_request(
        ready["port"], "/v1/completions", {"prompt": "once upon a time", "max_tokens": 1_000_000_000, "stream": stream}
    )
    if stream:
        wait_until(lambda: sock.recv(65536).count(b"data: ") > 0, 120, what="streamed tokens")
    else:
        wait_until(lambda: lines_with(unbounded, "Prompt processing progress"), 120, what="generation to start")
    sock.close()
    cancelled = wait_until(
        lambda: lines_with(unbounded, "request_cancelled")[before:], 120, what="the worker to notice the client left"
    )
    assert "reason=client_disconnected" in cancelled[0]
    assert f"max_tokens={UNBOUNDED}" in cancelled[0]  # the requested 1e9, capped to the limit
    # The handler has returned once nothing is in flight; it stopped the generation's context before.
    wait_until(lambda: stats(unbounded)["in_flight"] == 0, 120, what="the cancelled request's handler to return")
    tokens = int(cancelled[0].split("completion_tokens=")[1].split()[0])
    assert stats(unbounded)["generated_tokens"] - generated == tokens  # the handler's count is the worker's
    moves = len(unbounded.batches())  # the cancelled request's batch moves: moves - started
    status, reply = http_json(
        f"{ready['endpoints']['openai_base_url']}/completions", {"prompt": "hello", "max_tokens": 3}
    )
    assert status == 200 and reply["usage"]["completion_tokens"] == 3
    # The generation thread dropped the cancelled request, not only the handler: the next request
    # decodes alone (a generation left running would share its batch: 2 rows).
    joined = wait_until(
        lambda: (later := unbounded.batches()[moves:]) and len(later) >= moves - started and later,
        120,
        what="the next request's batch moves (as many as the cancelled one made) on stderr",
    )
    assert all(move["rows"] == 1 for move in joined), joined


def test_sigterm_mid_generation_exits_promptly() -> None:
    worker = start("--limit-max-tokens", UNBOUNDED)
    try:
        sock = raw_request(
            worker.ready()["port"], "/v1/completions", {"prompt": "once upon a time", "max_tokens": 1_000_000_000}
        )
        wait_until(lambda: lines_with(worker, "Prompt processing progress"), 120, what="generation to start")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(120) == ExitCode.OK
        sock.close()
    finally:
        worker.stop()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"max_tokens": 5}, "messages"),  # mlx_lm: "Request did not contain messages"
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, "max_tokens must be at least 1"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_p": 2}, "top_p must be at most 1"),
    ],
    ids=["no-messages", "negative-max-tokens", "top-p-above-1"],
)
def test_mlx_lms_own_refusals_come_in_the_openai_error_shape(bounded: Worker, body: dict, says: str) -> None:
    """mlx_lm answers these itself with {"error": "text"}; clients read error.message everywhere."""
    status, payload = http_json(f"http://127.0.0.1:{bounded.ready()['port']}/v1/chat/completions", body, timeout=120)
    assert status == 400, payload
    error = payload["error"]
    assert isinstance(error, dict) and says in error["message"], payload
    assert error["type"] == error["code"] == "invalid_request_error"


def test_an_unknown_path_and_a_missing_length_answer_in_the_openai_error_shape(bounded: Worker) -> None:
    port = bounded.ready()["port"]
    status, payload = http_json(f"http://127.0.0.1:{port}/v1/nothing-here", {"messages": []}, timeout=120)
    assert status == 404 and payload["error"]["message"] == "Not Found", payload
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, _, body = read_all(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 411"), head
    assert json.loads(body)["error"]["message"] == "Content-Length header is required", body


def test_a_request_to_a_worker_whose_model_failed_to_load_gets_503_server_error(tmp_path: Path) -> None:
    """The worker's own 503 is the server's fault: type server_error (veloxd/openai_errors.py), as the
    gateway's 5xx. In-process, the worker's HTTP server and generation thread on a real socket: a
    whole worker exits as soon as its generation thread dies, before a waiting request is answered."""
    from veloxd.serve.mlx_compat.generators import generation_thread
    from veloxd.serve.mlx_compat.handler import handler_class
    from veloxd.serve.mlx_compat.httpd import ServerHandle
    from veloxd.serve.mlx_compat.provider import PinnedProvider, model_names, server_args

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # no model_type: mlx_lm's load raises on the generation thread
    model_id, names = model_names(str(broken))
    provider = PinnedProvider(server_args(model=str(broken)), names, on_loaded=lambda model, tokenizer: False)
    port = free_port()
    handle = ServerHandle("127.0.0.1", port, provider, handler_class(model_id, names, api_key=None))
    server = threading.Thread(target=handle.serve_forever, daemon=True)
    server.start()
    try:
        generation_thread(handle.generator).join(LOAD_S)
        assert not handle.generator.generation_available()
        body = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, reply = http_json(f"http://127.0.0.1:{port}/v1/chat/completions", body, timeout=120)
    finally:
        handle.httpd.shutdown()
        handle.close(join_timeout=10)
        server.join(10)
    assert status == 503, reply
    assert reply["error"] == {"message": "the model failed to load", "type": "server_error", "code": "server_error"}
