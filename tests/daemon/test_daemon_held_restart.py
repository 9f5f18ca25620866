"""An edit the world is not ready for keeps the running server: its restart is held.

A READY server moved to a port another process holds, or to a model path not there yet, keeps
serving with the settings it runs (same pid, same port), status says `restart held` and why and
exits 3; once the condition clears the restart goes ahead with the new settings. A server that
is not serving starts (or waits) with the new settings at once, as before. An edit back to the
settings the held server runs drops the hold and restarts nothing; `veloxd plan` says so first.
"""

from __future__ import annotations

import shutil
import signal
import socket
from pathlib import Path

from structlog.typing import EventDict

from tests.fixtures.daemon_harness import FAKE_MODEL, DaemonHarness, entry, to_yaml, wait_for
from tests.fixtures.fake_spawner import FakeSpawner, S, bring_up, config_of, make_entry, names_of, state_of
from tests.support import free_port, http_json
from veloxd.config.plan import Plan, diff
from veloxd.config.world import Condition
from veloxd.daemon.held import blockers, foreseen, holds, undone
from veloxd.daemon.supervised import Supervised
from veloxd.daemon.supervisor import Supervisor


def listening(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_blockers_check_the_port_only_when_it_moves() -> None:
    held_port = {"127.0.0.1:2": "port 2 on 127.0.0.1 is already in use"}

    def port_check(host: str, port: int) -> str | None:
        return held_port.get(f"{host}:{port}")

    def no_world(entry: Supervised) -> list[Condition]:
        return []

    running = make_entry("a", 1)
    assert blockers(running, make_entry("a", 1, stop_timeout_s=7), no_world, port_check) == []
    [port] = blockers(running, make_entry("a", 2), no_world, port_check)
    assert port.kind == "port" and port.message == held_port["127.0.0.1:2"]
    assert blockers(make_entry("a", 2), make_entry("a", 2, stop_timeout_s=7), no_world, port_check) == []
    # held by one of our servers that the same plan stops (two servers swap ports): not a blocker
    assert blockers(running, make_entry("a", 2), no_world, port_check, freed=frozenset({2})) == []


def test_plan_foresees_what_waits_by_the_supervisors_rules() -> None:
    taken = {3, 4, 5}  # held by some process: 3 and 4 by our servers the plan stops, 5 by a stranger

    def port_check(host: str, port: int) -> str | None:
        return f"port {port} on {host} is already in use" if port in taken else None

    def missing_model(entry: Supervised) -> list[Condition]:
        return [Condition("model_path", ("model",), "model path gone")] if entry.name == "lost" else []

    current = {"swap": make_entry("swap", 3), "gone": make_entry("gone", 4), "stays": make_entry("stays", 6)}
    desired = {
        "swap": make_entry("swap", 4),  # onto the port of a server the plan stops: free by then
        "stays": make_entry("stays", 6, stop_timeout_s=9),  # its own port, held by itself
        "new": make_entry("new", 3),  # onto the port `swap` leaves: free by then
        "squat": make_entry("squat", 5),  # a stranger holds it
        "lost": make_entry("lost", 7),
    }
    plan = Plan(added=("new", "squat", "lost"), removed=("gone",), changed={"swap": ("port",), "stays": ("model",)})
    found = foreseen(plan, current, desired, {"swap", "stays"}, missing_model, port_check)
    assert {name: [c.kind for c in conditions] for name, conditions in found.items()} == {
        "squat": ["port"],
        "lost": ["model_path"],
    }
    # the same move with nothing freed: `swap` waits for a port a server of ours holds
    plan = Plan(changed={"swap": ("port",)}, unchanged=("stays",))
    only_swap = {"swap": current["swap"], "gone": current["gone"]}
    found = foreseen(plan, only_swap, {"swap": desired["swap"]}, {"swap"}, missing_model, port_check)
    assert [c.message for c in found["swap"]] == ["port 4 on 127.0.0.1 is already in use"]


def test_holding_one_restart_holds_the_one_moving_onto_its_port() -> None:
    """a (ready on 3) moves to 5, which a stranger holds: held, it keeps 3; so b (ready on 4),
    moving onto 3, is held too (it would otherwise stop and wait for a port a keeps), and c,
    moving onto b's 4, in turn; d moves onto a port nobody holds and goes ahead."""
    taken = {3, 4, 5, 6}

    def port_check(host: str, port: int) -> str | None:
        return f"port {port} on {host} is already in use" if port in taken else None

    def no_world(entry: Supervised) -> list[Condition]:
        return []

    running = {"a": make_entry("a", 3), "b": make_entry("b", 4), "c": make_entry("c", 6), "d": make_entry("d", 7)}
    desired = {"a": make_entry("a", 5), "b": make_entry("b", 3), "c": make_entry("c", 4), "d": make_entry("d", 8)}
    stopped_ports = {name: entry.port for name, entry in running.items()}
    found = holds(running, desired, stopped_ports, no_world, port_check)
    assert {name: [c.message for c in conditions] for name, conditions in found.items()} == {
        "a": ["port 5 on 127.0.0.1 is already in use"],
        "b": ["port 3 on 127.0.0.1 is already in use"],
        "c": ["port 4 on 127.0.0.1 is already in use"],
    }
    # the stranger gone, the three move along the chain as one plan: nothing held
    taken.discard(5)
    assert holds(running, desired, stopped_ports, no_world, port_check) == {}


def test_a_move_to_a_taken_port_keeps_the_server_until_the_port_is_free(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    old_port, new_port = free_port(), free_port()
    beta_port = free_port()
    h.write({"alpha": entry(old_port), "beta": entry(beta_port)})
    squatter = listening(new_port)
    try:
        h.start()
        h.wait_states({"alpha": "ready", "beta": "ready"})
        pid = h.server("alpha")["pid"]
        h.write({"alpha": entry(new_port), "beta": entry(beta_port)})
        held = h.wait_event("server_restart_held", server="alpha")
        assert f"port {new_port} on 127.0.0.1 is already in use" in held["reason"], held
        # the state file is written at the end of the loop turn that logged the event: wait for it
        alpha = wait_for(lambda: (s := h.server("alpha"))["pending"] and s, 60, "the hold in the state file")
        assert alpha["state"] == "ready" and alpha["pid"] == pid and alpha["port"] == old_port, alpha
        assert alpha["pending"] == "restart held" and f"port {new_port}" in alpha["held_reason"], alpha
        assert http_json(f"http://127.0.0.1:{old_port}/health", timeout=30)[0] == 200  # still serving
        status = h.cli("status")
        assert status.returncode == 3, status  # not settled while a restart is held
        assert f"ready, restart held: port {new_port}" in status.stdout, status.stdout
        assert not h.events("server_stopping", server="alpha")

        squatter.close()
        h.wait_event("server_restart_released", server="alpha")
        wait_for(
            lambda: h.server("alpha")["state"] == "ready" and h.server("alpha")["port"] == new_port,
            60,
            "alpha ready on its new port",
        )
        assert h.server("alpha")["pid"] != pid and h.server("alpha")["held_reason"] is None
        assert http_json(f"http://127.0.0.1:{new_port}/health", timeout=30)[0] == 200
        assert h.cli("status").returncode == 0
    finally:
        squatter.close()
        h.cleanup()


def test_a_move_to_a_model_path_not_there_yet_is_held_until_it_appears(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    port = free_port()
    later = tmp_path / "models" / "next"
    h.write({"alpha": entry(port)})
    try:
        h.start()
        h.wait_states({"alpha": "ready"})
        pid = h.server("alpha")["pid"]
        h.write({"alpha": entry(port, model=str(later))})
        held = h.wait_event("server_restart_held", server="alpha")
        assert str(later) in held["reason"], held
        assert h.server("alpha")["pid"] == pid and h.server("alpha")["model"] == FAKE_MODEL
        shutil.copytree(FAKE_MODEL, later)  # the watch on the path's parent sees it: no poll wait
        h.wait_event("server_restart_released", server="alpha")
        wait_for(
            lambda: h.server("alpha")["state"] == "ready" and h.server("alpha")["model"] == str(later),
            60,
            "alpha ready on the new model",
        )
        assert h.server("alpha")["pid"] != pid
    finally:
        h.cleanup()


def test_a_plan_compares_a_held_server_with_the_settings_it_runs() -> None:
    """a runs port 1, held on its way to 2: a config back on 1 undoes the restart (a live key aside:
    an update in place); b, held too, is edited to a third port: still a restart."""
    running = {"a": make_entry("a", 1), "b": make_entry("b", 3)}
    desired = {"a": make_entry("a", 1, description="back"), "b": make_entry("b", 5), "c": make_entry("c", 6)}
    plan = Plan(changed={"a": ("port", "description"), "b": ("port",)}, unchanged=("c",))
    rebased, dropped = undone(plan, running, desired)
    assert dropped == ["a"]
    assert dict(rebased.changed) == {"b": ("port",)} and dict(rebased.updated) == {"a": ("description",)}
    assert rebased.unchanged == ("c",)
    rebased, dropped = undone(plan, running, {**desired, "a": make_entry("a", 1)})
    assert dropped == ["a"] and rebased.unchanged == ("c", "a") and "a" not in rebased.updated
    # nothing held, or removed: the plan as it is
    assert undone(plan, {}, desired) == (plan, [])
    gone = Plan(removed=("a",))
    assert undone(gone, running, {}) == (gone, [])


def test_an_edit_back_to_what_a_held_server_runs_drops_the_hold_without_a_restart(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict]
) -> None:
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    child = bring_up(supervisor, spawner, "a", 1.0)
    server = supervisor.servers["a"]
    with listening(free_port()) as squatter:
        moved = make_entry("a", squatter.getsockname()[1])
        supervisor.apply(diff(config_of(a), config_of(moved)), {"a": moved}, now=2.0)
        assert "a" in supervisor.held
        while_held = supervisor.snapshot()["a"]
        back = make_entry("a", a.port, description="back where it was")  # and a live key
        supervisor.apply(diff(config_of(moved), config_of(back)), {"a": back}, now=3.0)
    assert "a" not in supervisor.held and not supervisor.rollouts
    assert state_of(server) is S.READY and child.signals == [] and len(spawner.children) == 1
    assert server.entry == back  # updated in place
    [dropped] = [e for e in events if e["event"] == "server_restart_hold_dropped"]
    assert dropped["server"] == "a" and dropped["reason"] == "desired_matches_running"
    snap = supervisor.snapshot()["a"]
    assert snap["pending"] is None and snap["held_reason"] is None and snap.get("held_runs") is None
    assert while_held["held_runs"]["port"] == a.port  # what `veloxd plan` compares an edit with
    supervisor.tick(100.0)  # no hold left to release later either
    assert len(spawner.children) == 1 and child.signals == [] and names_of(events, "server_stopping") == []


def test_undoing_a_held_edit_keeps_the_server_and_veloxd_plan_says_so_first(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    old_port, new_port = free_port(), free_port()
    h.write({"alpha": entry(old_port)})
    squatter = listening(new_port)
    try:
        h.start()
        h.wait_states({"alpha": "ready"})
        pid = h.server("alpha")["pid"]
        h.write({"alpha": entry(new_port)})
        h.wait_event("server_restart_held", server="alpha")
        edited = h.cli("plan", str(h.config))  # the file as applied: the restart is still held
        assert edited.returncode == 0, edited.stderr
        assert "  ~ alpha                restart  (port)" in edited.stdout, edited.stdout
        assert f"restart held (it keeps serving as it runs) while: port {new_port}" in edited.stdout
        reverted = tmp_path / "reverted.yaml"
        reverted.write_text(to_yaml({"alpha": entry(old_port)}))
        planned = h.cli("plan", str(reverted))
        assert planned.returncode == 0, planned.stderr
        assert "  = alpha                unchanged" in planned.stdout, planned.stdout
        assert planned.stdout.splitlines()[-1] == "no changes (1 unchanged)", planned.stdout

        mark = h.mark()
        h.write({"alpha": entry(old_port)})
        dropped = h.wait_event("server_restart_hold_dropped", after=mark, server="alpha")
        assert dropped["reason"] == "desired_matches_running" and dropped["pid"] == pid
        wait_for(lambda: h.server("alpha")["pending"] is None, 60, "the state file to show the hold dropped")
        alpha = h.server("alpha")
        assert (alpha["state"], alpha["pid"], alpha["port"], alpha["pending"]) == ("ready", pid, old_port, None)
        assert not h.events("server_stopping", server="alpha") and len(h.events("server_starting")) == 1
        assert h.cli("status").returncode == 0
        squatter.close()  # the port the undone edit wanted comes free: nothing is left to release
        h.signal(signal.SIGHUP)
        h.wait_event("config_unchanged", after=mark)
        assert h.server("alpha")["pid"] == pid and not h.events("server_restart_released")
    finally:
        squatter.close()
        h.cleanup()
