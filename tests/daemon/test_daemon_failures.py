"""Crashes, backoff, FATAL and stop escalation, with stand-in workers that misbehave on request.

One daemon, one server per failure mode; the entry's `env` tells the stand-in what to do.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
from collections.abc import Iterator

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_for, wait_gone
from tests.support import free_port

STUBBORN_STOP_S = 1.5  # ignores SIGTERM: every stop of it lasts this long


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHarness]:
    h = DaemonHarness(tmp_path_factory.mktemp("failures"))
    held = socket.socket()  # somebody else's listener on the port of `squatted`
    held.bind(("127.0.0.1", 0))
    held.listen()
    h.held_port = held.getsockname()[1]  # type: ignore[attr-defined]
    h.servers = {  # type: ignore[attr-defined]
        "crashy": entry(free_port()),
        "invalid": entry(free_port(), env={"FAKE_EXIT_CODE": "2"}),
        "squatted": entry(h.held_port),  # type: ignore[attr-defined]
        "silent": entry(free_port(), ready_timeout_s=0.5, env={"FAKE_NO_READY": "1"}),
        "stubborn": entry(free_port(), stop_timeout_s=STUBBORN_STOP_S, env={"FAKE_IGNORE_TERM": "1"}),
    }
    h.write(h.servers)  # type: ignore[attr-defined]
    h.start()
    try:
        yield h
    finally:
        h.cleanup()
        held.close()


def test_killed_worker_backs_off_then_goes_fatal_after_the_limit(daemon: DaemonHarness) -> None:
    """kill -9 three times (max_failures=3): BACKOFF with growing delays, then FATAL, no more starts."""
    delays = []
    for attempt in (1, 2, 3):
        servers = daemon.wait_states({"crashy": "ready"})
        pid = servers["crashy"]["pid"]
        mark = daemon.mark()
        os.kill(pid, signal.SIGKILL)
        exited = daemon.wait_event("server_exited", after=mark, server="crashy")
        assert exited["signal"] == "SIGKILL" and exited["expected"] is False and exited["pid"] == pid
        if attempt < 3:
            backoff = daemon.wait_event("server_backoff", after=mark, server="crashy")
            assert backoff["failures"] == attempt and backoff["from_state"] == "ready"
            delays.append(backoff["delay_s"])
    fatal = daemon.wait_event("server_fatal", after=mark, server="crashy")
    assert fatal["failures"] == 3 and "3 failures within 60s" in fatal["reason"]
    assert delays == [0.2, 0.4]
    assert daemon.server("crashy")["state"] == "fatal" and daemon.server("crashy")["pid"] is None


def test_fatal_server_stays_down_until_restarted_by_name(daemon: DaemonHarness) -> None:
    """FATAL is left only by `veloxd restart NAME` (or a config change); failures start over."""
    daemon.wait_states({"crashy": "fatal"})
    mark = daemon.mark()
    assert daemon.cli("restart", "crashy").returncode == 0
    ready = daemon.wait_event("server_ready", after=mark, server="crashy")
    assert pid_alive(ready["pid"])
    os.kill(ready["pid"], signal.SIGKILL)  # the first failure again, not the fourth
    backoff = daemon.wait_event("server_backoff", after=mark, server="crashy")
    assert backoff["failures"] == 1


def test_exit_code_2_is_fatal_at_once(daemon: DaemonHarness) -> None:
    """Invalid input never fixes itself: one start, FATAL, with the worker's own message attached."""
    fatal = daemon.wait_event("server_fatal", server="invalid")
    assert "code 2" in fatal["reason"]
    assert "fake worker: failing with code 2" in fatal["last_lines"]["stderr"]
    assert len(daemon.events("server_starting", server="invalid")) == 1


def test_port_held_by_another_process_is_fatal_naming_the_port(daemon: DaemonHarness) -> None:
    """The pre-flight check refuses to spawn; the reason names the port (and its holder when lsof can)."""
    port = daemon.held_port  # type: ignore[attr-defined]
    fatal = daemon.wait_event("server_fatal", server="squatted")
    assert f"port {port} on 127.0.0.1 is already in use" in fatal["reason"]
    assert not [r for r in daemon.events("server_starting", server="squatted") if r.get("pid")]
    assert "already in use" in daemon.cli("status").stdout


def test_worker_that_never_gets_ready_is_killed_and_backs_off(daemon: DaemonHarness) -> None:
    """No READY line within ready_timeout_s: SIGKILL, counted as a failed start, FATAL at the limit."""
    timeout = daemon.wait_event("server_ready_timeout", server="silent")
    assert timeout["ready_timeout_s"] == 0.5
    backoff = daemon.wait_event("server_backoff", server="silent")
    assert backoff["reason"] == "ready_timeout" and backoff["from_state"] == "starting"
    daemon.wait_event("server_fatal", server="silent", timeout=30)
    assert len(daemon.events("server_starting", server="silent")) == 3
    assert not daemon.events("server_ready", server="silent")


def test_fatal_server_starts_again_when_its_entry_changes(daemon: DaemonHarness) -> None:
    """Fixing the entry of a FATAL server (here: its env) is a config change: it starts and gets ready."""
    daemon.wait_states({"invalid": "fatal"})
    mark = daemon.mark()
    daemon.servers["invalid"] = {**daemon.servers["invalid"], "env": {}}  # type: ignore[attr-defined]
    daemon.write(daemon.servers)  # type: ignore[attr-defined]
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert list(reloaded["plan"]["changed"]) == ["invalid"]
    ready = daemon.wait_event("server_ready", after=mark, server="invalid")
    assert pid_alive(ready["pid"])


def test_live_only_change_to_a_fatal_entry_starts_it_again(daemon: DaemonHarness) -> None:
    """Raising ready_timeout_s restarts nothing that runs, but a FATAL server gets another chance."""
    daemon.wait_states({"silent": "fatal"})
    mark = daemon.mark()
    daemon.servers["silent"] = {**daemon.servers["silent"], "ready_timeout_s": 0.6}  # type: ignore[attr-defined]
    daemon.write(daemon.servers)  # type: ignore[attr-defined]
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert list(reloaded["plan"]["updated"]) == ["silent"] and not reloaded["plan"]["changed"]
    starting = daemon.wait_event("server_starting", after=mark, server="silent")
    assert starting["ready_timeout_s"] == 0.6
    assert not [r for r in daemon.records()[mark:] if r["event"] == "server_stopping" and r["server"] != "silent"]


def test_saves_during_a_reload_coalesce_into_one_follow_up(daemon: DaemonHarness) -> None:
    """While a reload waits for a slow stop, five more saves lead to exactly one follow-up reload,
    which applies the last of them."""
    daemon.wait_states({"stubborn": "ready"})
    servers = daemon.servers  # type: ignore[attr-defined]
    mark = daemon.mark()
    servers["stubborn"] = {**servers["stubborn"], "method": "affine", "bits": 8}
    daemon.write(servers)
    daemon.wait_event("server_stopping", after=mark, server="stubborn")  # the first reload is under way
    for bits in (2, 3, 4, 6, 2):
        servers["stubborn"] = {**servers["stubborn"], "bits": bits}
        daemon.write(servers)
    final_sha = hashlib.sha256(daemon.config.read_bytes()).hexdigest()
    follow_up = daemon.wait_event("config_reloaded", after=mark, config_sha256=final_sha, timeout=30)
    assert follow_up["source"] == "follow_up"
    ready = daemon.wait_event("server_ready", after=daemon.records().index(follow_up), server="stubborn")
    assert ready["ready"]["bits"] == 2
    reloads = [r for r in daemon.records()[mark:] if r["event"] == "config_reloaded"]
    assert [r["source"] for r in reloads] == ["watch", "follow_up"]
    daemon.wait_states({"stubborn": "ready"})


def test_stop_escalates_to_sigkill_after_stop_timeout(daemon: DaemonHarness) -> None:
    """A worker ignoring SIGTERM is killed after its stop_timeout_s; then SIGTERM ends the daemon, exit 0."""
    daemon.wait_states({"stubborn": "ready"})
    spawned = daemon.spawned_pids()
    mark = daemon.mark()
    assert daemon.stop() == 0
    killed = daemon.wait_event("server_killed", after=mark, server="stubborn")
    assert killed["stop_timeout_s"] == STUBBORN_STOP_S
    stopped = daemon.wait_event("server_stopped", after=mark, server="stubborn")
    assert stopped["killed"] is True and stopped["exit"]["signal"] == "SIGKILL"
    wait_gone(spawned, 2)
    wait_for(lambda: daemon.events("daemon_stopped"), 5, "daemon_stopped")
