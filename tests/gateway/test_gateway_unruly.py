"""Workers and clients that misbehave: what the gateway answers, records and leaves running.

A real daemon (at --log-level debug) in front of stand-in workers (tests/gateway/unruly_worker.py,
which log every request they get): a worker that dies after the request reached it is a 502 and the
request is not sent again; an answer that is not HTTP is a 502; a client that stops reading with its
connection open is given up (client_stalled) and its worker stops generating; the gateway's debug
events stay debug in the daemon's log.

The client write bound is 60 s in the gateway process; its test runs the gateway's own application
(build_app, GatewayRunner, as `veloxd gateway` does) in this process with a bound of 1 s, in front
of the same daemon and workers.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.fixtures.daemon_harness import DaemonHarness
from tests.gateway import unruly_worker
from tests.gateway.support import GATEWAY, fake_entry, gateway_yaml, model_dir, post
from tests.support import free_port, wait_until
from veloxd.daemon.client import DaemonClient
from veloxd.gateway.app import build_app
from veloxd.gateway.connections import GatewayRunner
from veloxd.gateway.events import CLIENT_DISCONNECTED, CLIENT_STALLED, REQUEST_FINISHED, Accounting, RequestRecord
from veloxd.gateway.fleet import Fleet
from veloxd.gateway.limits import ConnectionLimits

UNRULY_WORKER = Path(unruly_worker.__file__).resolve()
WRITE_TIMEOUT_S = 1.0
DEADLINE_S = 60.0


class Unruly:
    def __init__(self, h: DaemonHarness, base: str, logs: dict[str, Path]) -> None:
        self.h, self.base, self.logs = h, base, logs

    def received(self, server: str) -> list[str]:
        """What the server's workers logged: `<prompt>` per request, `stopped` when a stream ended."""
        path = self.logs[server]
        return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def unruly(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unruly]:
    root = tmp_path_factory.mktemp("unruly")
    model = model_dir(root, "m")
    logs = {name: root / f"{name}.log" for name in ("alpha", "endless")}
    port = free_port()
    servers = {name: fake_entry(model, env={"UNRULY_LOG": str(log)}) for name, log in logs.items()}
    h = DaemonHarness(root)
    h.worker_command = f"{shlex.quote(sys.executable)} {shlex.quote(str(UNRULY_WORKER))}"
    h.write(gateway_yaml({"port": port}, servers))
    try:
        h.start("--log-level", "debug")
        h.wait_states({GATEWAY: "ready", "alpha": "ready", "endless": "ready"})
        yield Unruly(h, f"http://127.0.0.1:{port}", logs)
    finally:
        h.cleanup()


def test_a_worker_dying_after_the_request_reached_it_is_a_502_and_not_sent_again(unruly: Unruly) -> None:
    h, base = unruly.h, unruly.base
    first = h.server("alpha")["pid"]
    assert post(base, "/v1/completions", {"model": "alpha", "prompt": "x"})[0] == 200  # spares open now
    mark = h.mark()

    status, body = post(base, "/v1/completions", {"model": "alpha", "prompt": "die"})
    error = body["error"]
    assert (status, error["code"], error["server"], error["type"]) == (502, "upstream_failed", "alpha", "server_error")
    assert "'alpha'" in error["message"] and "before answering" in error["message"], error
    assert unruly.received("alpha").count("die") == 1  # the successor never got it
    record = h.wait_event(REQUEST_FINISHED, after=mark, server="alpha", status=502)
    assert record["error"].startswith("upstream:") and record["cancelled"] is None

    # The next request waits for the daemon's restart of the worker and is answered by the new one.
    status, body = post(base, "/v1/completions", {"model": "alpha", "prompt": "after"}, timeout=DEADLINE_S)
    assert status == 200 and body["pid"] not in (None, first), body
    assert unruly.received("alpha").count("die") == 1


def test_an_answer_that_is_not_http_is_a_502(unruly: Unruly) -> None:
    status, body = post(unruly.base, "/v1/completions", {"model": "alpha", "prompt": "garbage"})
    error = body["error"]
    assert (status, error["code"], error["server"]) == (502, "upstream_failed", "alpha"), body
    assert "not an HTTP status line" in error["message"]


def test_gateway_debug_events_stay_debug_in_the_daemons_log(unruly: Unruly) -> None:
    h = unruly.h
    port = int(unruly.base.rsplit(":", 1)[1])
    mark = h.mark()
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as garbage:
        garbage.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        assert garbage.recv(65536).split(b" ", 2)[1] == b"400"
    refused = h.wait_event("gateway_malformed_request_refused", after=mark)
    assert (refused["level"], refused["logger"]) == ("debug", "veloxd.gateway"), refused


def _silent_client(port: int, payload: dict[str, Any]) -> socket.socket:
    """A client that sends its request and never reads, its connection kept open."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    client.settimeout(DEADLINE_S)
    client.connect(("127.0.0.1", port))
    body = json.dumps(payload).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    client.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return client


def test_a_client_that_stops_reading_is_given_up_and_its_worker_stops(unruly: Unruly) -> None:
    records: list[RequestRecord] = []
    port = free_port()
    stopped = unruly.received("endless").count("stopped")

    async def scenario() -> None:
        fleet = Fleet(DaemonClient(unruly.h.state_dir))
        await fleet.refresh()
        accounting = Accounting()
        accounting.listen(records.append)
        app = build_app(fleet, accounting, host="127.0.0.1", port=port, write_timeout_s=WRITE_TIMEOUT_S)
        runner = GatewayRunner(
            app, lambda: ConnectionLimits.of(fleet.settings), handler_cancellation=True, access_log=None
        )
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        clients = []
        try:
            for prompt, stream in (("endless", True), ("big", False)):
                model = "endless" if stream else "alpha"
                clients.append(_silent_client(port, {"model": model, "prompt": prompt, "stream": stream}))
                await asyncio.to_thread(
                    wait_until, lambda: len(records) == len(clients), DEADLINE_S, what=f"{prompt} given up"
                )
        finally:
            for client in clients:
                client.close()
            await runner.cleanup()

    asyncio.run(scenario())
    for record, stream in zip(records, (True, False), strict=True):
        assert (record.cancelled, record.status, record.stream) == (CLIENT_STALLED, 499, stream), record
        assert f"read nothing for {WRITE_TIMEOUT_S:g} s" in (record.error or "")
        assert record.fields()["cancelled"] == CLIENT_STALLED  # in its gateway_request_finished event
    # Giving up closed the worker's connection: the endless stream stopped.
    wait_until(
        lambda: unruly.received("endless").count("stopped") > stopped, DEADLINE_S, what="the endless stream stopped"
    )


def test_a_client_that_leaves_is_recorded_as_disconnected(unruly: Unruly) -> None:
    h = unruly.h
    mark = h.mark()
    port = int(unruly.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as client:
        body = json.dumps({"model": "endless", "prompt": "endless", "stream": True}).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        client.sendall(head + body)
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
    record = h.wait_event(REQUEST_FINISHED, after=mark, server="endless")
    assert record["status"] == 499 and record["cancelled"] == CLIENT_DISCONNECTED, record
