"""A control request whose client gave up is not carried out later.

The daemon is stopped with SIGSTOP while a client sends its request: the kernel queues the
connection in the listen backlog, the client times out and leaves, and once the daemon runs again
it reads the request. It must drop it (`control_request_dropped`) rather than restart a server or
reload long after `veloxd restart`/`reload` said it failed. Requests without `expires_at` (older
clients) are still served. Real daemon, stand-in workers, real unix sockets.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.daemon.conftest import StartDaemon, StartedDaemon
from tests.fixtures.daemon_harness import DEADLINE_S, entry, wait_for
from tests.support import free_port
from veloxd.daemon.control import DaemonUnreachable, request_at

# What a request that was carried out logs: the restart of `a`, or the reload's verdict.
DONE = {"restart": "server_restart_requested", "reload": "config_unchanged"}


def ready_daemon(start_daemon: StartDaemon) -> tuple[StartedDaemon, Path, int]:
    """A daemon with one ready stand-in worker `a`, its control socket and the worker's pid."""
    h = start_daemon({"a": entry(free_port())})
    pid = h.wait_states({"a": "ready"})["a"]["pid"]
    return h, Path(h.state()["daemon"]["control_socket"]), pid


@contextmanager
def stopped(h: StartedDaemon) -> Iterator[None]:
    """SIGSTOP until the block ends: connections wait in the backlog, nothing is accepted."""
    assert h.proc is not None
    h.signal(signal.SIGSTOP)
    try:
        process = psutil.Process(h.proc.pid)
        wait_for(lambda: process.status() == psutil.STATUS_STOPPED, DEADLINE_S, "the daemon to stop")
        yield
    finally:
        h.signal(signal.SIGCONT)


def payload(command: str) -> dict[str, Any]:
    return {"command": "restart", "name": "a"} if command == "restart" else {"command": "reload"}


def outcome(h: StartedDaemon, after: int, command: str) -> dict[str, Any]:
    """The first record from `after` on that says the request was dropped, or carried out."""
    wanted = ("control_request_dropped", DONE[command])
    return wait_for(
        lambda: next((r for r in h.records()[after:] if r["event"] in wanted), None), DEADLINE_S, f"{command}'s fate"
    )


def assert_not_done(h: StartedDaemon, control: Path, after: int, command: str, worker: int) -> None:
    """Nothing of the request happened: a later request is answered (the loop has handled anything
    queued before it), no record says it was done, and the worker is the same process."""
    assert request_at(control, {"command": "status"})["ok"]
    assert DONE[command] not in [r["event"] for r in h.records()[after:]]
    assert h.server("a")["pid"] == worker and h.server("a")["state"] == "ready"


@pytest.mark.parametrize("command", ["restart", "reload"])
def test_a_request_whose_client_timed_out_in_the_backlog_is_dropped(start_daemon: StartDaemon, command: str) -> None:
    """`veloxd restart a` / `veloxd reload` time out while the daemon does not accept; the request
    waiting in the backlog is dropped as expired when the daemon reads it."""
    h, control, worker = ready_daemon(start_daemon)
    mark = h.mark()
    with stopped(h), pytest.raises(DaemonUnreachable, match="did not answer"):
        request_at(control, payload(command), timeout=0.5)
    dropped = outcome(h, mark, command)
    assert dropped["event"] == "control_request_dropped", dropped
    assert dropped["command"] == command and dropped["reason"] == "expired" and dropped["level"] == "warning"
    assert_not_done(h, control, mark, command, worker)


def test_a_request_whose_client_left_is_dropped_without_an_expiry(start_daemon: StartDaemon) -> None:
    """An older client (no `expires_at`) that sent its restart and closed before the daemon read it:
    dropped as client_gone."""
    h, control, worker = ready_daemon(start_daemon)
    mark = h.mark()
    with stopped(h), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(control))
        sock.sendall(json.dumps(payload("restart")).encode() + b"\n")
    dropped = outcome(h, mark, "restart")
    assert dropped["event"] == "control_request_dropped", dropped
    assert dropped["command"] == "restart" and dropped["reason"] == "client_gone"
    assert_not_done(h, control, mark, "restart", worker)


def ask(control: Path, request: dict[str, Any]) -> dict[str, Any]:
    """One raw request line, and the daemon's answer (the client stays until it comes)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(DEADLINE_S)
        sock.connect(str(control))
        sock.sendall(json.dumps(request).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n") and (chunk := sock.recv(65536)):
            answer += chunk
    return json.loads(answer)


def test_an_expired_request_is_answered_and_not_done_while_one_without_expiry_is_served(
    start_daemon: StartDaemon,
) -> None:
    """A client still there but past its `expires_at` gets an error and nothing is done; a request
    without `expires_at` is served as before; a malformed one is refused, saying what it must be."""
    h, control, worker = ready_daemon(start_daemon)
    mark = h.mark()
    answer = ask(control, {**payload("reload"), "expires_at": time.time() - 60})
    assert answer["ok"] is False and "expired" in answer["error"], answer
    dropped = outcome(h, mark, "reload")
    assert dropped["event"] == "control_request_dropped" and dropped["reason"] == "expired", dropped
    assert_not_done(h, control, mark, "reload", worker)

    served = ask(control, payload("reload"))
    assert served["ok"] is True and served["unchanged"] is True, served
    assert h.wait_event("config_unchanged", after=mark)["source"] == "control"
    bad = ask(control, {**payload("reload"), "expires_at": "soon"})
    assert bad["ok"] is False and "expires_at" in bad["error"], bad
