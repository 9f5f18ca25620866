"""The gateway never waits forever, and a flood of clients cannot take it down or fill the log.

A real daemon and gateway in front of stand-in workers (tests/fixtures/fake_worker.py, via
tests/gateway/split_worker.py): a stopped worker (SIGSTOP) and one that stalls mid-stream get
504s and SSE error events naming the timeout; silent sockets beyond a lowered file limit; a
slow-header client; the connection cap; malformed requests; dashboard actions under DNS rebinding.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import shlex
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness
from tests.gateway import split_worker
from tests.gateway.support import GATEWAY, events_after, fake_entry, gateway_yaml, model_dir, post
from tests.support import free_port, wait_until

TOKEN = "t0ken"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
SPLIT_WORKER = Path(split_worker.__file__).resolve()
FILE_LIMIT = 256
SILENT_SOCKETS = 300


def _start(tmp_path: Path, gateway: dict[str, Any], servers: dict[str, Any]) -> DaemonHarness:
    h = DaemonHarness(tmp_path)
    h.worker_command = f"{shlex.quote(sys.executable)} {shlex.quote(str(SPLIT_WORKER))}"
    h.write(gateway_yaml(gateway, servers))
    h.start(env={"GW_KEY": TOKEN})
    try:
        h.wait_states({GATEWAY: "ready", **{name: "ready" for name in servers}})
    except BaseException:
        h.cleanup()  # the caller's cleanup is not reached: no daemon or worker may outlive the test
        raise
    return h


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonHarness, str]]:
    """alpha answers normally, stall sends one chunk then nothing for a minute, split splits its usage event."""
    root = tmp_path_factory.mktemp("upstreams")
    model = model_dir(root, "m")
    port = free_port()
    gateway = {"port": port, "api_key_env": "GW_KEY", "first_byte_timeout_s": 1, "read_timeout_s": 1}
    servers = {
        "alpha": fake_entry(model, port=free_port()),
        "stall": fake_entry(model, env={"FAKE_STREAM_CHUNKS": "3", "FAKE_CHUNK_DELAY_S": "60"}),
        "split": fake_entry(model, env={"SPLIT_USAGE": "1"}),
    }
    h = _start(root, gateway, servers)
    try:
        yield h, f"http://127.0.0.1:{port}"
    finally:
        h.cleanup()


def _stream(base: str, model: str) -> list[bytes]:
    """The raw `data:` lines of a streamed completion, read until the gateway closes."""
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
    try:
        body = json.dumps({"model": model, "prompt": "x", "stream": True})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", **BEARER})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type", "").startswith("text/event-stream")
        return [line for line in response.read().split(b"\n") if line.startswith(b"data: ")]
    finally:
        conn.close()


def test_a_stopped_worker_gets_a_504_naming_the_timeout_streamed_or_not(upstreams: tuple[DaemonHarness, str]) -> None:
    h, base = upstreams
    pid = h.server("alpha")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        for stream in (False, True):
            status, body = post(base, "/v1/completions", {"model": "alpha", "prompt": "x", "stream": stream}, BEARER)
            error = body["error"]
            assert (status, error["code"], error["timeout"], error["server"]) == (
                504,
                "upstream_timeout",
                "gateway.first_byte_timeout_s",
                "alpha",
            ), body
            assert "'alpha'" in error["message"] and "gateway.first_byte_timeout_s (1 s)" in error["message"]
    finally:
        os.kill(pid, signal.SIGCONT)
    status, body = post(base, "/v1/completions", {"model": "alpha", "prompt": "x"}, BEARER)
    assert (status, body["pid"]) == (200, pid)  # the same worker, answering again
    records = wait_until(
        lambda: (found := events_after(h, 0, "gateway_request_finished", server="alpha", status=504))[1:] and found, 60
    )
    assert len(records) == 2 and all("first_byte_timeout_s" in r["error"] for r in records)


def test_a_stream_that_stalls_midway_ends_with_an_error_event(upstreams: tuple[DaemonHarness, str]) -> None:
    h, base = upstreams
    lines = _stream(base, "stall")
    assert len(lines) == 2, lines  # the one chunk the worker sent, then the gateway's error event
    assert json.loads(lines[0][6:])["choices"][0]["text"] == "t0"
    error = json.loads(lines[1][6:])["error"]
    assert error["code"] == "upstream_timeout" and "gateway.read_timeout_s (1 s)" in error["message"], error
    assert "'stall'" in error["message"]
    record = wait_until(lambda: events_after(h, 0, "gateway_request_finished", server="stall"), 60)[-1]
    assert record["status"] == 504 and "read_timeout_s" in record["error"]


def test_a_usage_event_split_across_reads_is_counted(upstreams: tuple[DaemonHarness, str]) -> None:
    h, base = upstreams
    mark = h.mark()
    lines = _stream(base, "split")
    assert lines[-1] == b"data: [DONE]" and len(lines) == 3, lines
    record = wait_until(lambda: events_after(h, mark, "gateway_request_finished", server="split"), 60)[-1]
    tokens = (record["status"], record["tokens_in"], record["tokens_out"])
    assert tokens == (200, split_worker.PROMPT_TOKENS, split_worker.COMPLETION_TOKENS), record


def _action(base: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
    try:
        conn.request("POST", path, b"", headers)  # http.client sends our Host instead of its own
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_dashboard_actions_refuse_rebinding_and_accept_lowercase_bearer(
    upstreams: tuple[DaemonHarness, str],
) -> None:
    _, base = upstreams
    port = base.rsplit(":", 1)[1]
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    status, body = _action(base, "/api/reload", {**evil, **BEARER})
    assert status == 403 and "evil.example" in body["error"], body
    own = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}
    status, body = _action(base, "/api/reload", {**own, "Authorization": f"bearer {TOKEN}"})
    assert status == 200 and body["ok"], body
    assert _action(base, "/api/reload", {**own, "Authorization": f"bearer x{TOKEN}"})[0] == 401


def _from_gateway(record: dict[str, Any]) -> bool:
    return record.get("server") == GATEWAY or record.get("logger") == "veloxd.gateway"


def _connect_silently(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))  # in progress; the kernel completes it into the backlog
        sockets.append(sock)
    return sockets


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


def test_silent_sockets_past_the_file_limit_slow_headers_the_cap_and_garbage(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "m")
    port = free_port()
    gateway = {
        "port": port,
        "api_key_env": "GW_KEY",
        "header_timeout_s": 2,
        "body_timeout_s": 2,
        "keepalive_timeout_s": 2,
    }
    entry = fake_entry(model, port=free_port())
    h = _start(tmp_path, gateway, {"alpha": entry})
    base = f"http://127.0.0.1:{port}"
    try:
        gateway_pid = h.server(GATEWAY)["pid"]
        resource.prlimit(gateway_pid, resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))
        mark = h.mark()

        with socket.create_connection(("127.0.0.1", port), timeout=60) as garbage:
            garbage.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
            assert garbage.recv(65536).split(b" ", 2)[1] == b"400"

        silent = _connect_silently(port, SILENT_SOCKETS)
        try:
            h.wait_event("gateway_accept_failed", after=0)  # the limit was reached
            status, body = post(base, "/v1/completions", {"model": "alpha", "prompt": "x"}, BEARER, timeout=120)
            assert status == 200 and body["model"] == "alpha"
            wait_until(lambda: all(_closed_by_peer(s) for s in silent), 120, what="every silent socket closed")
        finally:
            for sock in silent:
                sock.close()
        # The gateway's records (its events and its output): the stand-in worker's own are not its doing.
        lines = [json.dumps(r) for r in h.records()[mark:] if _from_gateway(r)]
        assert not [line for line in lines if "Traceback" in line or "Error handling request" in line], lines
        grown = sum(len(line) + 1 for line in lines)
        assert grown < 8192, lines  # a few throttled events, not a line per socket or per retry
        assert events_after(h, 0, "gateway_connections_timed_out")

        with socket.create_connection(("127.0.0.1", port), timeout=60) as slow:
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            assert slow.recv(1) == b""  # closed by the gateway after gateway.header_timeout_s

        with socket.create_connection(("127.0.0.1", port), timeout=60) as short:
            head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            short.sendall(head.encode() + b"Content-Length: 100\r\n\r\n{}")  # 2 of the 100 bytes announced
            answer = short.recv(65536)
            assert answer.split(b" ", 2)[1] == b"408" and b"gateway.body_timeout_s (2 s)" in answer, answer

        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        idle.request("GET", "/health")
        assert idle.getresponse().read() == b'{"status": "ok"}'  # HTTP/1.1: the connection stays open
        assert idle.sock is not None and idle.sock.recv(1) == b""  # until gateway.keepalive_timeout_s
        idle.close()

        mark = h.mark()
        h.write(gateway_yaml({**gateway, "header_timeout_s": 300, "max_connections": 2}, {"alpha": entry}))
        h.wait_event("config_reloaded", after=mark)
        holders = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(2)]
        try:
            status, body = wait_until(  # the gateway polls the daemon's view: the new cap is live shortly
                lambda: (
                    (answer := post(base, "/v1/completions", {"model": "alpha", "prompt": "x"}, BEARER))[0] != 200
                    and answer
                ),
                60,
                what="the cap of 2 connections applied",
            )
            assert status == 503 and body["error"]["code"] == "too_many_connections", body
            assert "gateway.max_connections (2)" in body["error"]["message"]
        finally:
            for sock in holders:
                sock.close()
        wait_until(
            lambda: post(base, "/v1/completions", {"model": "alpha", "prompt": "x"}, BEARER)[0] == 200,
            60,
            what="a request answered once the holders left",
        )
    finally:
        with contextlib.suppress(Exception):
            assert h.stop() == 0
        h.cleanup()
