"""Liveness after READY: periodic /health probes, N failures in a row -> UNRESPONSIVE, SIGTERM, SIGKILL
after stop_timeout_s, then a restart with backoff as after a crash.

The decisions (veloxd.daemon.liveness) are tested alone, then through the real Supervisor and
ServerProcess with the recording spawner and a fake clock of tests/fixtures/fake_spawner.py:
the spawner's check_health only records the probe; the test reports each outcome as the loop would.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from structlog.typing import EventDict

from tests.fixtures.fake_spawner import FakeSpawner, bring_up, config_of, make_entry, names_of, state_of
from tests.support import free_port
from veloxd.config.plan import diff
from veloxd.config.sections import Health
from veloxd.daemon import liveness
from veloxd.daemon import messages as m
from veloxd.daemon.server import ServerProcess, wall_clock
from veloxd.daemon.state import IllegalTransition, ServerState, transition
from veloxd.daemon.supervisor import Supervisor

S = ServerState
HEALTH = {"interval_s": 10.0, "timeout_s": 2.0, "failures": 3}


# ---- the pure decisions ---------------------------------------------------------------------
def test_probes_come_one_interval_apart_and_never_overlap() -> None:
    policy = Health(interval_s=10.0, timeout_s=2.0, failures=3)
    live = liveness.on_ready(100.0, policy)
    assert not liveness.probe_due(live, 109.999) and liveness.probe_due(live, 110.0)
    live = liveness.probe_started(live)
    assert not liveness.probe_due(live, 500.0) and liveness.next_deadline(live) is None  # one in flight
    live = liveness.probe_finished(live, live.sequence, "no answer within 2 s", 112.0, policy)
    assert live.failures == 1 and liveness.next_deadline(live) == 122.0  # one interval after it ended


def test_failures_count_in_a_row_and_a_success_resets_them() -> None:
    policy = Health(interval_s=1.0, timeout_s=1.0, failures=3)
    live = liveness.on_ready(0.0, policy)
    for now, error in [(1, "x"), (2, "x"), (3, None), (4, "x"), (5, "x")]:
        live = liveness.probe_started(live)
        live = liveness.probe_finished(live, live.sequence, error, float(now), policy)
        assert not liveness.hung(live, policy), now
    live = liveness.probe_started(live)
    live = liveness.probe_finished(live, live.sequence, "x", 6.0, policy)
    assert live.failures == 3 and liveness.hung(live, policy)


def test_a_report_of_another_probe_changes_nothing() -> None:
    policy = Health(interval_s=1.0, timeout_s=1.0, failures=1)
    live = liveness.probe_started(liveness.on_ready(0.0, policy))
    assert liveness.probe_finished(live, live.sequence + 1, "late", 5.0, policy) is live


def test_unresponsive_is_entered_only_from_ready_and_left_like_a_crash() -> None:
    assert transition(S.READY, S.UNRESPONSIVE) is S.UNRESPONSIVE
    for new in (S.BACKOFF, S.FATAL, S.STOPPING):
        assert transition(S.UNRESPONSIVE, new) is new
    for old in (S.STARTING, S.BACKOFF, S.STOPPED, S.WAITING):
        with pytest.raises(IllegalTransition):
            transition(old, S.UNRESPONSIVE)
    with pytest.raises(IllegalTransition):
        transition(S.UNRESPONSIVE, S.READY)  # a hung worker is killed, never trusted again


# ---- through the real Supervisor, with a fake clock -------------------------------------------
def ready_server(supervisor: Supervisor, spawner: FakeSpawner, **extra: Any) -> ServerProcess:
    a = make_entry("a", free_port(), health=dict(HEALTH), **extra)
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    bring_up(supervisor, spawner, "a", 1.0)
    return supervisor.servers["a"]


def probe(supervisor: Supervisor, spawner: FakeSpawner, now: float, error: str | None, answered: float) -> None:
    """Let the loop wake at `now` (a probe starts), then report its outcome at `answered`."""
    supervisor.tick(now)
    name, spawn_id, sequence, _ = spawner.checks[-1]
    supervisor.on_message(m.HealthProbed(name, spawn_id, sequence, error), answered)


def due(server: ServerProcess) -> float:
    """When the server wants the loop to wake next (asserted: the states it is read in have a deadline)."""
    deadline = server.next_deadline()
    assert deadline is not None, f"{server.name} has no deadline in state {server.state.value}"
    return deadline


def test_a_ready_server_is_probed_every_interval_with_its_timeout(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    server = ready_server(supervisor, spawner)
    assert server.next_deadline() == 11.0 and spawner.checks == []
    supervisor.tick(10.9)
    assert spawner.checks == []  # not a moment early
    probe(supervisor, spawner, 11.0, None, 11.1)
    spawn_id = spawner.latest("a")[0]
    assert spawner.checks == [("a", spawn_id, 1, 2.0)]
    assert server.next_deadline() == 21.1 and server.state is S.READY


def test_a_probe_still_running_is_not_doubled(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    server = ready_server(supervisor, spawner)
    supervisor.tick(11.0)
    supervisor.tick(40.0)  # the first probe has not reported yet
    assert len(spawner.checks) == 1 and server.next_deadline() is None


def test_failures_in_a_row_mark_it_unresponsive_then_sigterm_sigkill_and_backoff(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    server = ready_server(supervisor, spawner)
    child = spawner.latest("a")[1]
    probe(supervisor, spawner, 11.0, "no answer within 2 s", 13.0)
    probe(supervisor, spawner, 23.0, "no answer within 2 s", 25.0)
    assert state_of(server) is S.READY and server.snapshot()["health"] == {"probes": 2, "failures": 2}
    assert child.signals == []
    probe(supervisor, spawner, 35.0, "no answer within 2 s", 37.0)
    assert state_of(server) is S.UNRESPONSIVE and child.signals == [signal.SIGTERM]
    event = next(e for e in events if e["event"] == "server_unresponsive")
    assert {
        k: event[k] for k in ("server", "pid", "failures", "interval_s", "timeout_s", "error", "stop_timeout_s")
    } == {
        "server": "a",
        "pid": child.pid,
        "failures": 3,
        "interval_s": 10.0,
        "timeout_s": 2.0,
        "error": "no answer within 2 s",
        "stop_timeout_s": 5.0,
    }
    assert server.snapshot()["state"] == "unresponsive"
    assert server.next_deadline() == 42.0  # stop_timeout_s after SIGTERM
    supervisor.tick(41.9)
    assert child.signals == [signal.SIGTERM]
    supervisor.tick(42.0)
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    assert names_of(events, "server_killed") == ["a"]
    child.returncode = -signal.SIGKILL
    exited_after = wall_clock()
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], -signal.SIGKILL), 42.5)
    assert state_of(server) is S.BACKOFF and server.next_deadline() == 43.5  # backoff_initial_s, as a crash
    backoff = next(e for e in events if e["event"] == "server_backoff")
    assert backoff["reason"] == "unresponsive" and backoff["failures"] == 1
    assert server.last_error is not None and server.last_error.startswith("unresponsive: 3 health probes failed")
    assert exited_after <= server.snapshot()["last_error_at"] <= server.since  # when: the exit's moment
    supervisor.tick(43.5)
    assert state_of(server) is S.STARTING and len(spawner.children) == 2
    assert server.snapshot()["health"] is None


def test_a_success_between_failures_keeps_it_ready(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    server = ready_server(supervisor, spawner)
    probe(supervisor, spawner, 11.0, "HTTP 503", 11.1)
    probe(supervisor, spawner, 21.1, "HTTP 503", 21.2)
    probe(supervisor, spawner, 31.2, None, 31.3)
    probe(supervisor, spawner, 41.3, "HTTP 503", 41.4)
    probe(supervisor, spawner, 51.4, "HTTP 503", 51.5)
    assert server.state is S.READY and spawner.latest("a")[1].signals == []
    assert names_of(events, "server_health_recovered") == ["a"]
    assert len(names_of(events, "server_health_failed")) == 4


def test_a_hung_worker_that_exits_on_sigterm_is_not_sigkilled(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    server = ready_server(supervisor, spawner)
    for start in (11.0, 23.0, 35.0):
        probe(supervisor, spawner, start, "x", start + 2)
    child = spawner.latest("a")[1]
    child.returncode = -signal.SIGTERM
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], -signal.SIGTERM), 38.0)
    supervisor.tick(100.0)
    assert child.signals == [signal.SIGTERM]
    assert server.state is S.STARTING  # backoff of 1 s was over by 100


def test_stopping_an_unresponsive_server_keeps_its_kill_deadline(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    server = ready_server(supervisor, spawner)
    for start in (11.0, 23.0, 35.0):
        probe(supervisor, spawner, start, "x", start + 2)
    supervisor.stop_all(40.0)
    child = spawner.latest("a")[1]
    assert state_of(server) is S.STOPPING and child.signals == [signal.SIGTERM]
    supervisor.tick(42.0)
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], -signal.SIGKILL), 42.1)
    assert state_of(server) is S.STOPPED


def test_a_late_probe_report_after_a_restart_is_ignored(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    server = ready_server(supervisor, spawner)
    supervisor.tick(11.0)
    old = spawner.checks[-1]
    supervisor.restart(["a"], "restart_requested", 12.0)
    supervisor.on_message(m.ChildExited("a", old[1], 0), 12.5)
    bring_up(supervisor, spawner, "a", 13.0)
    supervisor.on_message(m.HealthProbed("a", old[1], old[2], "x"), 14.0)
    assert server.state is S.READY and server.snapshot()["health"] == {"probes": 0, "failures": 0}


def test_repeated_hangs_count_toward_fatal(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    server = ready_server(
        supervisor,
        spawner,
        restart={"max_failures": 2, "window_s": 600, "backoff_initial_s": 1.0, "backoff_max_s": 4.0},
    )
    now = 1.0
    for round_ in range(2):
        for _ in range(3):
            now = due(server)
            probe(supervisor, spawner, now, "x", now + 2)
        now += 2
        assert state_of(server) is S.UNRESPONSIVE, round_
        supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], -signal.SIGTERM), now)
        if state_of(server) is S.BACKOFF:
            now = due(server)
            supervisor.tick(now)
            bring_up(supervisor, spawner, "a", now)
    assert state_of(server) is S.FATAL and server.fatal_reason is not None
    assert "2 failures within 600s" in server.fatal_reason


def test_a_shorter_interval_applied_live_counts_from_the_update(supervisor: Supervisor, spawner: FakeSpawner) -> None:
    a = make_entry("a", free_port(), health={"interval_s": 3600.0})
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    bring_up(supervisor, spawner, "a", 1.0)
    server = supervisor.servers["a"]
    assert server.next_deadline() == 3601.0
    faster = make_entry("a", a.port, health={"interval_s": 2.0})
    supervisor.apply(diff(config_of(a), config_of(faster)), {"a": faster}, now=10.0)
    health = server.entry.health
    assert server.state is S.READY and health is not None and health.interval_s == 2.0  # updated, not restarted
    assert server.next_deadline() == 12.0
