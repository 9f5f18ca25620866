"""Crashes, backoff, FATAL and stop escalation, with stand-in workers that misbehave on request.

Each test starts its own daemon with the servers it needs (stand-in workers start in well under a
second), so tests run alone and in any order; the entry's `env` tells the stand-in what to do.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from tests.daemon.conftest import StartDaemon
from tests.fixtures.daemon_harness import DEADLINE_S, DaemonHarness, entry, pid_alive, wait_for, wait_gone
from tests.support import free_port

STUBBORN_STOP_S = 1.5  # ignores SIGTERM: every stop of it lasts this long

SERVERS: dict[str, Callable[[], dict[str, Any]]] = {
    "crashy": lambda: entry(free_port()),
    "invalid": lambda: entry(free_port(), env={"FAKE_EXIT_CODE": "2"}),
    "skewed": lambda: entry(free_port(), method="kivi", bits=2, env={"FAKE_READY_CONFIG": '{"bits": 4}'}),
    "silent": lambda: entry(free_port(), ready_timeout_s=0.5, env={"FAKE_NO_READY": "1"}),
    "stubborn": lambda: entry(free_port(), stop_timeout_s=STUBBORN_STOP_S, env={"FAKE_IGNORE_TERM": "1"}),
}


def named(*names: str, **extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Entries for `start_daemon` (tests/daemon/conftest.py): SERVERS' by name, then extra ones by keyword."""
    return {**{name: SERVERS[name]() for name in names}, **extra}


def kill_until_fatal(daemon: DaemonHarness, name: str) -> None:
    """SIGKILL `name` whenever it is ready until the daemon gives up on it (FATAL)."""
    while True:
        server = wait_for(
            lambda: (s := daemon.server(name)).get("state") in ("ready", "fatal") and s,
            DEADLINE_S,
            f"{name} ready or fatal",
        )
        if server["state"] == "fatal":
            return
        killed: int = server["pid"]
        os.kill(killed, signal.SIGKILL)

        def noticed(killed: int = killed) -> bool:  # bound now: B023
            return daemon.server(name).get("pid") != killed

        wait_for(noticed, DEADLINE_S, f"{name} noticed its exit")


def test_killed_worker_backs_off_then_goes_fatal_after_the_limit(start_daemon: StartDaemon) -> None:
    """kill -9 three times (max_failures=3): BACKOFF with growing delays, then FATAL, no more starts."""
    daemon = start_daemon(named("crashy"))
    delays: list[float] = []
    killed: list[int] = []
    for attempt in (1, 2, 3):
        # The state file is written after the loop pass that logged the exit: until then it still
        # shows the killed worker as ready, so wait for a worker that was not killed yet.
        server = wait_for(
            lambda: (s := daemon.server("crashy")).get("state") == "ready" and s.get("pid") not in killed and s,
            DEADLINE_S,
            "crashy ready with a new worker",
        )
        pid = server["pid"]
        killed.append(pid)
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
    assert daemon.wait_states({"crashy": "fatal"})["crashy"]["pid"] is None


def test_fatal_server_stays_down_until_restarted_by_name(start_daemon: StartDaemon) -> None:
    """FATAL is left only by `veloxd restart NAME` (or a config change); failures start over."""
    daemon = start_daemon(named("crashy"))
    kill_until_fatal(daemon, "crashy")
    assert daemon.server("crashy")["pid"] is None
    mark = daemon.mark()
    assert daemon.cli("restart", "crashy").returncode == 0
    ready = daemon.wait_event("server_ready", after=mark, server="crashy")
    assert pid_alive(ready["pid"])
    os.kill(ready["pid"], signal.SIGKILL)  # the first failure again, not the fourth
    backoff = daemon.wait_event("server_backoff", after=mark, server="crashy")
    assert backoff["failures"] == 1


def test_exit_code_2_is_fatal_at_once(start_daemon: StartDaemon) -> None:
    """Invalid input never fixes itself: one start, FATAL, with the worker's own message attached."""
    daemon = start_daemon(named("invalid"))
    fatal = daemon.wait_event("server_fatal", server="invalid")
    assert "code 2" in fatal["reason"]
    assert "fake worker: failing with code 2" in fatal["last_lines"]["stderr"]
    assert len(daemon.events("server_starting", server="invalid")) == 1


def test_worker_echoing_another_kv_config_is_refused(start_daemon: StartDaemon) -> None:
    """The daemon passes the entry as one --entry-json document and checks that READY echoes its KV
    settings: a mismatch is FATAL, named."""
    daemon = start_daemon(named("skewed"))
    refused = daemon.wait_event("server_refused", server="skewed")
    assert "different KV config" in refused["reason"] and "bits: asked 2, got 4" in refused["reason"]
    fatal = daemon.wait_event("server_fatal", server="skewed")
    assert fatal["reason"] == refused["reason"]
    assert not daemon.events("server_ready", server="skewed")
    assert len(daemon.events("server_starting", server="skewed")) == 1  # refused once, never retried


def test_port_held_by_another_process_waits_naming_the_port_then_starts_once_freed(start_daemon: StartDaemon) -> None:
    """A port held by someone else is a fact of the world, not of the file: only that entry WAITS
    (no worker spawned, the reason names the port), and it starts by itself once the port is free."""
    held = socket.socket()  # somebody else's listener on the entry's port
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        daemon = start_daemon(named("crashy", squatted=entry(port)))
        waiting = daemon.wait_event("server_waiting", server="squatted")
        assert f"port {port} on 127.0.0.1 is already in use" in waiting["reason"]
        assert waiting["conditions"][0]["kind"] == "port"
        daemon.wait_states({"crashy": "ready", "squatted": "waiting"})
        assert not [r for r in daemon.events("server_starting", server="squatted") if r.get("pid")]
        status = daemon.cli("status")
        assert f"squatted: waiting: port {port} on 127.0.0.1 is already in use" in status.stdout
        assert status.returncode == 3  # running, but not every server is ready
    finally:
        held.close()
    daemon.wait_states({"squatted": "ready"}, timeout=90)  # the recheck schedule is capped at 30 s
    assert not daemon.events("server_fatal", server="squatted")


def test_worker_that_never_gets_ready_is_killed_and_backs_off(start_daemon: StartDaemon) -> None:
    """No READY line within ready_timeout_s: SIGKILL, counted as a failed start, FATAL at the limit."""
    daemon = start_daemon(named("silent"))
    timeout = daemon.wait_event("server_ready_timed_out", server="silent")
    assert timeout["ready_timeout_s"] == 0.5
    backoff = daemon.wait_event("server_backoff", server="silent")
    assert backoff["reason"] == "ready_timeout" and backoff["from_state"] == "starting"
    daemon.wait_event("server_fatal", server="silent")
    assert len(daemon.events("server_starting", server="silent")) == 3
    assert not daemon.events("server_ready", server="silent")


def test_fatal_server_starts_again_when_its_entry_changes(start_daemon: StartDaemon) -> None:
    """Fixing the entry of a FATAL server (here: its env) is a config change: it starts and gets ready."""
    daemon = start_daemon(named("invalid"))
    daemon.wait_states({"invalid": "fatal"})
    mark = daemon.mark()
    daemon.servers["invalid"] = {**daemon.servers["invalid"], "env": {}}
    daemon.write(daemon.servers)
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert list(reloaded["plan"]["changed"]) == ["invalid"]
    ready = daemon.wait_event("server_ready", after=mark, server="invalid")
    assert pid_alive(ready["pid"])


def test_live_only_change_to_a_fatal_entry_starts_it_again(start_daemon: StartDaemon) -> None:
    """Raising ready_timeout_s restarts nothing that runs, but a FATAL server gets another chance."""
    daemon = start_daemon(named("silent", "crashy"))
    daemon.wait_states({"silent": "fatal"})
    mark = daemon.mark()
    daemon.servers["silent"] = {**daemon.servers["silent"], "ready_timeout_s": 0.6}
    daemon.write(daemon.servers)
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert list(reloaded["plan"]["updated"]) == ["silent"] and not reloaded["plan"]["changed"]
    starting = daemon.wait_event("server_starting", after=mark, server="silent")
    assert starting["ready_timeout_s"] == 0.6
    assert not [r for r in daemon.records()[mark:] if r["event"] == "server_stopping" and r["server"] != "silent"]


def test_saves_during_a_reload_coalesce_into_one_follow_up(start_daemon: StartDaemon) -> None:
    """While a reload waits for a slow stop, five more saves lead to exactly one follow-up reload,
    which applies the last of them."""
    daemon = start_daemon(named("stubborn"))
    daemon.wait_states({"stubborn": "ready"})
    servers = daemon.servers
    mark = daemon.mark()
    servers["stubborn"] = {**servers["stubborn"], "method": "affine", "bits": 8}
    daemon.write(servers)
    daemon.wait_event("server_stopping", after=mark, server="stubborn")  # the first reload is under way
    for bits in (2, 3, 4, 6, 2):
        servers["stubborn"] = {**servers["stubborn"], "bits": bits}
        daemon.write(servers)
    final_sha = hashlib.sha256(daemon.config.read_bytes()).hexdigest()
    follow_up = daemon.wait_event("config_reloaded", after=mark, config_sha256=final_sha)
    assert follow_up["source"] == "follow_up"
    ready = daemon.wait_event("server_ready", after=daemon.records().index(follow_up), server="stubborn")
    assert ready["ready"]["bits"] == 2
    reloads = [r for r in daemon.records()[mark:] if r["event"] == "config_reloaded"]
    assert [r["source"] for r in reloads] == ["watch", "follow_up"]
    daemon.wait_states({"stubborn": "ready"})


def test_stop_escalates_to_sigkill_after_stop_timeout(start_daemon: StartDaemon) -> None:
    """A worker ignoring SIGTERM is killed after its stop_timeout_s; then SIGTERM ends the daemon, exit 0."""
    daemon = start_daemon(named("stubborn"))
    daemon.wait_states({"stubborn": "ready"})
    spawned = daemon.spawned_pids()
    mark = daemon.mark()
    assert daemon.stop() == 0
    killed = daemon.wait_event("server_killed", after=mark, server="stubborn")
    assert killed["stop_timeout_s"] == STUBBORN_STOP_S
    stopped = daemon.wait_event("server_stopped", after=mark, server="stubborn")
    assert stopped["killed"] is True and stopped["exit"]["signal"] == "SIGKILL"
    wait_gone(spawned, 120)
    wait_for(lambda: daemon.events("daemon_stopped"), 120, "daemon_stopped")
