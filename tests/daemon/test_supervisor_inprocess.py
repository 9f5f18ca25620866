"""The supervisor and each server's state machine, in process, with a fake clock and a fake spawner.

The spawner is the daemon's own seam (veloxd.daemon.spawner.Spawner): a recording stand-in
(tests/fixtures/fake_spawner.py) replaces the process layer, while everything above it
(ServerProcess, Supervisor, the plan, the restart policy) is the real code. Time is a number the test advances, so backoff, ready and stop timeouts
are exercised in microseconds and exactly.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from structlog.typing import EventDict

from tests.fixtures.fake_spawner import (
    FakeSpawner,
    S,
    bring_up,
    busy_now,
    config_of,
    make_entry,
    names_of,
    ready_line,
    start_and_exit_with_code_2,
    state_of,
)
from tests.support import free_port
from veloxd import protocol
from veloxd.config.plan import diff
from veloxd.config.sections import Dashboard
from veloxd.daemon import messages as m
from veloxd.daemon.process import process_start_time
from veloxd.daemon.sidecar import NAME as DASHBOARD
from veloxd.daemon.sidecar import DashboardSidecar, dashboard_snapshot
from veloxd.daemon.supervisor import Supervisor
from veloxd.daemon.views import status_code


def test_start_ready_after_ready_line_and_health(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    assert state_of(supervisor.servers["a"]) is S.STARTING
    spawn_id, _ = spawner.latest("a")
    supervisor.on_message(m.ReadyLine("a", spawn_id, ready_line(supervisor, "a")), 2.0)
    assert state_of(supervisor.servers["a"]) is S.STARTING  # READY needs /health too
    assert spawner.probes == [("a", spawn_id)]
    supervisor.on_message(m.Healthy("a", spawn_id), 2.5)
    assert state_of(supervisor.servers["a"]) is S.READY
    ready = next(e for e in events if e["event"] == "server_ready")
    assert ready["startup_s"] == 2.5 and ready["ready"] == ready_line(supervisor, "a")


def test_ready_timeout_kills_then_backs_off_with_doubling_delays_then_fatal(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    server = supervisor.servers["a"]
    now = 0.0
    delays: list[float] = []
    for attempt in range(3):
        assert state_of(server) is S.STARTING
        assert server.next_deadline() == now + 30
        now += 30
        supervisor.tick(now)
        spawn_id, child = spawner.latest("a")
        assert child.signals == [signal.SIGKILL], f"attempt {attempt}"
        child.returncode = -9
        supervisor.on_message(m.ChildExited("a", spawn_id, -9), now)
        if state_of(server) is S.BACKOFF:
            retry_at = server.next_deadline()
            assert retry_at is not None  # BACKOFF always has its retry time
            delays.append(retry_at - now)
            now = retry_at
            supervisor.tick(now)
    assert delays == [1.0, 2.0]
    assert state_of(server) is S.FATAL
    assert server.fatal_reason == "3 failures within 600s"
    assert len(spawner.children) == 3
    assert names_of(events, "server_ready_timed_out") == ["a", "a", "a"]


def test_exit_code_2_is_fatal_at_once_with_the_reason(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a = make_entry("a", free_port())
    child = start_and_exit_with_code_2(supervisor, spawner, a)
    server = supervisor.servers["a"]
    assert server.state is S.FATAL
    assert server.fatal_reason is not None and "code 2" in server.fatal_reason
    fatal = next(e for e in events if e["event"] == "server_fatal")
    assert fatal["last_lines"]["stderr"] == [f"worker {child.pid} said goodbye"]


def test_crash_after_ready_backs_off_and_the_next_start_is_a_new_spawn(
    supervisor: Supervisor, spawner: FakeSpawner
) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    first = bring_up(supervisor, spawner, "a", 1.0)
    first.returncode = -11
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], -11), 10.0)
    server = supervisor.servers["a"]
    assert state_of(server) is S.BACKOFF and server.next_deadline() == 11.0
    supervisor.tick(10.999)
    assert state_of(server) is S.BACKOFF  # not a moment early
    supervisor.tick(11.0)
    assert state_of(server) is S.STARTING and len(spawner.children) == 2
    assert server.snapshot()["restarts"] == 1


def test_ready_line_echoing_another_kv_config_is_refused_and_fatal(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a = make_entry("a", free_port(), method="kivi", bits=2)
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    spawn_id, child = spawner.latest("a")
    echoed = {**a.kv.to_dict(), "bits": 4}
    supervisor.on_message(m.ReadyLine("a", spawn_id, {"method": "kivi", "config": echoed}), 2.0)
    assert child.signals == [signal.SIGKILL] and spawner.probes == []
    child.returncode = -signal.SIGKILL
    supervisor.on_message(m.ChildExited("a", spawn_id, -signal.SIGKILL), 2.1)
    server = supervisor.servers["a"]
    assert server.state is S.FATAL
    assert server.fatal_reason == "the worker runs a different KV config than asked (bits: asked 2, got 4)"
    assert names_of(events, "server_refused") == ["a"]


def test_malformed_ready_line_is_refused(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    spawn_id, child = spawner.latest("a")
    supervisor.on_message(m.ReadyLine("a", spawn_id, {"raw": "{"}, "READY line is not JSON: ..."), 2.0)
    assert child.signals == [signal.SIGKILL]
    supervisor.on_message(m.ChildExited("a", spawn_id, -signal.SIGKILL), 2.1)
    assert supervisor.servers["a"].fatal_reason == "READY line is not JSON: ..."


def test_reports_from_an_old_spawn_are_ignored(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    old_id, old = spawner.latest("a")
    old.returncode = 1
    supervisor.on_message(m.ChildExited("a", old_id, 1), 1.0)
    supervisor.tick(2.0)  # backoff over: second spawn
    new_id, _ = spawner.latest("a")
    assert new_id != old_id
    supervisor.on_message(m.ReadyLine("a", old_id, {}), 2.1)
    supervisor.on_message(m.Healthy("a", old_id), 2.2)
    supervisor.on_message(m.ChildExited("a", old_id, 1), 2.3)
    assert supervisor.servers["a"].state is S.STARTING


def test_stop_sends_sigterm_then_sigkill_after_stop_timeout(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    child = bring_up(supervisor, spawner, "a", 1.0)
    supervisor.stop_all(100.0)
    server = supervisor.servers["a"]
    assert state_of(server) is S.STOPPING and child.signals == [signal.SIGTERM]
    supervisor.tick(104.9)
    assert child.signals == [signal.SIGTERM]
    supervisor.tick(105.0)
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    assert names_of(events, "server_killed") == ["a"]
    child.returncode = -9
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], -9), 105.1)
    assert state_of(server) is S.STOPPED and supervisor.all_stopped()


def test_reload_restarts_only_the_changed_entry_after_its_old_worker_exits(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a, b = make_entry("a", free_port()), make_entry("b", free_port())
    supervisor.apply(diff(None, config_of(a, b)), {"a": a, "b": b}, now=0.0)
    child_a, child_b = bring_up(supervisor, spawner, "a", 1.0), bring_up(supervisor, spawner, "b", 1.0)
    current = config_of(a, b)
    b2 = make_entry("b", b.port, method="kivi", bits=2)
    desired = config_of(a, b2)
    plan = diff(current, desired)
    assert set(plan.changed) == {"b"} and plan.unchanged == ("a",)
    supervisor.apply(plan, dict(desired.servers), now=5.0)
    assert child_a.signals == [] and child_b.signals == [signal.SIGTERM]
    assert len(spawner.children) == 2  # the new b waits until the old b is gone (port, memory)
    assert busy_now(supervisor)
    child_b.returncode = 0
    supervisor.on_message(m.ChildExited("b", spawner.latest("b")[0], 0), 6.0)
    assert not busy_now(supervisor)
    assert len(spawner.children) == 3
    name, _, new_b = spawner.children[-1]
    assert name == "b" and protocol.read_entry_document(new_b.argv[-1])["kv"]["method"] == "kivi"
    assert supervisor.servers["a"].child is child_a and supervisor.servers["a"].state is S.READY


def test_a_restart_queued_behind_another_rollout_shows_as_pending(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    """b's edit waits until a's rollout is done: b is still READY, but status must not call it settled."""
    a, b = make_entry("a", free_port()), make_entry("b", free_port())
    supervisor.apply(diff(None, config_of(a, b)), {"a": a, "b": b}, now=0.0)
    child_a, child_b = bring_up(supervisor, spawner, "a", 1.0), bring_up(supervisor, spawner, "b", 1.0)
    supervisor.restart(["a"], "test", now=2.0)  # a's worker ignores SIGTERM for now
    b2 = make_entry("b", b.port, method="kivi", bits=2)
    supervisor.apply(diff(config_of(a, b), config_of(a, b2)), {"a": a, "b": b2}, now=3.0)
    snap = supervisor.snapshot()
    assert (snap["a"]["state"], snap["a"]["pending"]) == ("stopping", "restart")
    assert (snap["b"]["state"], snap["b"]["pending"]) == ("ready", "restart") and child_b.signals == []
    me = {"running": True, "pid": os.getpid(), "start_time": process_start_time(os.getpid())}
    state = {"daemon": me, "servers": snap}
    assert status_code(state) == 3
    child_a.returncode = 0
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], 0), 4.0)  # a's rollout ends, b's stop begins
    snap = supervisor.snapshot()
    assert snap["a"]["pending"] is None and (snap["b"]["state"], snap["b"]["pending"]) == ("stopping", "restart")
    child_b.returncode = 0
    supervisor.on_message(m.ChildExited("b", spawner.latest("b")[0], 0), 5.0)
    bring_up(supervisor, spawner, "a", 6.0)
    bring_up(supervisor, spawner, "b", 6.0)
    snap = supervisor.snapshot()
    assert all(s["state"] == "ready" and s["pending"] is None for s in snap.values()), snap
    assert status_code({**state, "servers": snap}) == 0


def test_live_only_change_updates_in_place_without_a_restart(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    child = bring_up(supervisor, spawner, "a", 1.0)
    a2 = make_entry("a", a.port, description="now with a description", stop_timeout_s=9)
    plan = diff(config_of(a), config_of(a2))
    assert set(plan.updated) == {"a"} and not plan.changed
    supervisor.apply(plan, {"a": a2}, now=2.0)
    server = supervisor.servers["a"]
    assert server.child is child and child.signals == [] and server.entry.stop_timeout_s == 9
    assert len(spawner.children) == 1


def test_any_edit_of_a_fatal_entry_starts_it_again(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a = make_entry("a", free_port())
    start_and_exit_with_code_2(supervisor, spawner, a)
    assert supervisor.servers["a"].state is S.FATAL
    a2 = make_entry("a", a.port, ready_timeout_s=60)  # a live-only key: still the user acting on it
    supervisor.apply(diff(config_of(a), config_of(a2)), {"a": a2}, now=2.0)
    server = supervisor.servers["a"]
    assert server.state is S.STARTING and server.fatal_reason is None and len(spawner.children) == 2


def test_restart_of_a_fatal_server_clears_its_failures(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a = make_entry("a", free_port())
    start_and_exit_with_code_2(supervisor, spawner, a)
    supervisor.restart(["a"], "restart_command", now=3.0)
    server = supervisor.servers["a"]
    assert server.state is S.STARTING and server.failures == [] and len(spawner.children) == 2


def test_removed_entry_is_stopped_and_dropped(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a, b = make_entry("a", free_port()), make_entry("b", free_port())
    supervisor.apply(diff(None, config_of(a, b)), {"a": a, "b": b}, now=0.0)
    bring_up(supervisor, spawner, "a", 1.0)
    child_b = bring_up(supervisor, spawner, "b", 1.0)
    supervisor.apply(diff(config_of(a, b), config_of(a)), {"a": a}, now=2.0)
    assert "b" in supervisor.servers and child_b.signals == [signal.SIGTERM]
    child_b.returncode = 0
    supervisor.on_message(m.ChildExited("b", spawner.latest("b")[0], 0), 3.0)
    assert set(supervisor.servers) == {"a"}


def test_a_port_taken_by_a_stranger_waits_without_spawning_then_starts_once_free(
    supervisor: Supervisor, spawner: FakeSpawner
) -> None:
    """A port held by someone else is a condition of the world: WAITING (no spawn, the reason names
    the port), looked at again on the recheck schedule, STARTING once the port is free."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        a = make_entry("a", holder.getsockname()[1])
        supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
        server = supervisor.servers["a"]
        assert state_of(server) is S.WAITING and spawner.children == []
        assert server.fatal_reason is None and str(a.port) in server.snapshot()["waiting_reason"]
        assert supervisor.next_deadline() == 1.0
    finally:
        holder.close()
    supervisor.tick(1.0)
    assert state_of(server) is S.STARTING and len(spawner.children) == 1


def test_a_port_taken_between_the_check_and_the_bind_waits_too(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    """The port was free when the daemon looked and taken when the worker bound it (exit 4): the
    same WAITING as a port found taken before spawning, no failure counted, started again later."""
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    server = supervisor.servers["a"]
    spawn_id, child = spawner.latest("a")
    child.returncode = protocol.ExitCode.PORT_IN_USE
    supervisor.on_message(m.ChildExited("a", spawn_id, child.returncode), 1.0)
    assert state_of(server) is S.WAITING and server.fatal_reason is None and server.snapshot()["failures"] == 0
    assert server.snapshot()["waiting_reason"] == f"port {a.port} on 127.0.0.1 is in use"  # no error line: ours
    waiting = next(e for e in events if e["event"] == "server_waiting")
    assert waiting["conditions"][0]["kind"] == "port"
    supervisor.tick(2.0)  # the recheck finds the port free: a new worker
    assert state_of(server) is S.STARTING and len(spawner.children) == 2
    bring_up(supervisor, spawner, "a", 3.0)
    assert state_of(server) is S.READY


def test_the_dashboard_runs_under_the_same_supervisor_in_a_lane_that_does_not_wait_for_servers(
    supervisor: Supervisor, spawner: FakeSpawner, tmp_path: Path
) -> None:
    """The dashboard's restart goes on while a server's stop is still awaited, and a reload's
    follow-up waits only for the servers' lane; the state file shows the dashboard on its own."""
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    bring_up(supervisor, spawner, "a", 1.0)
    sidecar = DashboardSidecar(supervisor, tmp_path)
    sidecar.apply(Dashboard(port=free_port()), 1.0)
    dashboard = supervisor.servers[DASHBOARD]
    assert state_of(dashboard) is S.STARTING and spawner.latest(DASHBOARD)[1].argv[2:4] == [
        "--state-dir",
        str(tmp_path),
    ]
    spawn_id, _ = spawner.latest(DASHBOARD)
    supervisor.on_message(m.ReadyLine(DASHBOARD, spawn_id, {"endpoints": {}}), 2.0)  # no KV settings to check
    supervisor.on_message(m.Healthy(DASHBOARD, spawn_id), 2.0)
    assert state_of(dashboard) is S.READY and not busy_now(supervisor)
    supervisor.restart(["a"], "restart_requested", 3.0)  # a's stop lasts until its exit is reported
    sidecar.apply(Dashboard(port=free_port(), interval_s=2.0), 3.0)
    assert busy_now(supervisor) and state_of(dashboard) is S.STOPPING
    spawn_id, child = spawner.latest(DASHBOARD)
    child.returncode = 0
    supervisor.on_message(m.ChildExited(DASHBOARD, spawn_id, 0), 4.0)
    assert state_of(dashboard) is S.STARTING and "--interval-s" in spawner.latest(DASHBOARD)[1].argv
    assert state_of(supervisor.servers["a"]) is S.STOPPING and busy_now(supervisor)  # still the servers' rollout
    shown = dashboard_snapshot(supervisor.snapshot())
    assert shown is not None and shown["state"] == "starting" and "pending" not in shown
    sidecar.apply(None, 5.0)
    assert state_of(dashboard) is S.STOPPING


def test_a_high_max_failures_is_reached_and_failures_outside_the_window_are_forgotten(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    """max_failures may be up to 1000: the count must reach it (it once stopped at 65), and
    failures older than window_s no longer count (nor are they kept)."""
    restart = {"max_failures": 100, "window_s": 86400, "backoff_initial_s": 1.0, "backoff_max_s": 1.0}
    a = make_entry("a", free_port(), restart=restart)
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    server, now = supervisor.servers["a"], 0.0
    for crash in range(1, 101):
        spawn_id, child = spawner.latest("a")
        child.returncode = 1
        now += 1.0
        supervisor.on_message(m.ChildExited("a", spawn_id, 1), now)
        if crash < 100:
            assert state_of(server) is S.BACKOFF, crash
            now += 1.0
            supervisor.tick(now)
    assert state_of(server) is S.FATAL
    fatal = [e for e in events if e["event"] == "server_fatal"]
    assert [e["failures"] for e in fatal] == [100], fatal

    # a day later, 2 crashes count as 2, not 102
    b = make_entry("b", free_port(), restart={**restart, "window_s": 60})
    supervisor.apply(diff(config_of(a), config_of(a, b)), {"a": a, "b": b}, now=now)
    server = supervisor.servers["b"]
    for at in (now + 1, now + 1000):
        spawn_id, child = spawner.latest("b")
        child.returncode = 1
        supervisor.on_message(m.ChildExited("b", spawn_id, 1), at)
        assert state_of(server) is S.BACKOFF and len(server.failures) == 1, server.failures
        supervisor.tick(at + 1.0)
