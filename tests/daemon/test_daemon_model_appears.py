"""A model path that appears starts the server waiting for it once, whichever notices it first.

Two things look: the waiting server's own recheck (its backoff timer, or `veloxd reload`) and the
watch on the path, whose `model_changed` comes after a second of quiet. The first starts the
server; the second finds a worker spawned from what the path holds now (or a start queued) and
does nothing. New content after that spawn (a copy still going on) still restarts it.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from structlog.typing import EventDict

from tests.fixtures.daemon_harness import FAKE_MODEL, DaemonHarness, entry, wait_for
from tests.fixtures.fake_spawner import FakeSpawner, S, bring_up, config_of, make_entry, names_of, state_of
from tests.support import free_port
from veloxd.config.plan import diff
from veloxd.daemon import messages as m
from veloxd.daemon.supervisor import Supervisor
from veloxd.daemon.watch import watch_path


def move_into_place(path: Path) -> None:
    """A copy of the fake model renamed into place, as a finished download is."""
    staging = path.parent.parent / f".{path.name}.partial"
    shutil.copytree(FAKE_MODEL, staging)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, path)


def waiting_for_its_model(supervisor: Supervisor, spawner: FakeSpawner, path: Path) -> None:
    a = make_entry("a", free_port(), model=str(path))
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    assert state_of(supervisor.servers["a"]) is S.WAITING and spawner.children == []
    assert supervisor.next_deadline() == 1.0


def test_the_recheck_starts_it_and_the_watch_report_after_it_does_nothing(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict], tmp_path: Path
) -> None:
    path = tmp_path / "models" / "next"
    waiting_for_its_model(supervisor, spawner, path)
    move_into_place(path)
    supervisor.tick(1.0)  # the recheck timer sees it first
    server = supervisor.servers["a"]
    assert state_of(server) is S.STARTING and len(spawner.children) == 1
    _, child = spawner.latest("a")
    assert supervisor.model_changed(["a"], present=True, now=2.0) == []  # the watch, a second later
    supervisor.tick(2.0)
    bring_up(supervisor, spawner, "a", 2.5)
    assert supervisor.model_changed(["a"], present=True, now=3.0) == []  # READY by then: the same
    supervisor.tick(3.0)
    assert state_of(server) is S.READY and child.signals == [] and len(spawner.children) == 1
    assert names_of(events, "server_starting") == ["a"] and not supervisor.rollouts


def test_the_watch_report_starts_it_and_the_recheck_after_it_does_nothing(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict], tmp_path: Path
) -> None:
    path = tmp_path / "models" / "next"
    waiting_for_its_model(supervisor, spawner, path)
    move_into_place(path)
    assert supervisor.model_changed(["a"], present=True, now=0.5) == []  # WAITING: it looks at once
    supervisor.tick(0.5)
    assert state_of(supervisor.servers["a"]) is S.STARTING and len(spawner.children) == 1
    supervisor.tick(1.0)  # the recheck it had planned finds it started
    supervisor.tick(10.0)
    assert len(spawner.children) == 1 and names_of(events, "server_starting") == ["a"]


def test_content_that_changes_after_the_spawn_still_restarts_it(
    supervisor: Supervisor, spawner: FakeSpawner, tmp_path: Path
) -> None:
    """Started from a path still being written: the files that change after the spawn are not what
    the worker read, so the watch's report restarts it (a second start that is due)."""
    path = tmp_path / "models" / "next"
    waiting_for_its_model(supervisor, spawner, path)
    move_into_place(path)
    supervisor.tick(1.0)
    bring_up(supervisor, spawner, "a", 1.5)
    (path / "model-00002.safetensors").write_bytes(b"\0" * 64)  # the copy was not done
    assert supervisor.model_changed(["a"], present=True, now=2.5) == ["a"]
    spawn_id, child = spawner.latest("a")
    assert child.signals == [signal.SIGTERM]
    supervisor.on_message(m.ChildExited("a", spawn_id, 0), 3.0)
    assert len(spawner.children) == 2 and state_of(supervisor.servers["a"]) is S.STARTING


def test_a_held_restart_released_by_its_timer_is_not_restarted_again_by_the_watch(
    supervisor: Supervisor, spawner: FakeSpawner, events: list[EventDict], tmp_path: Path
) -> None:
    """The same race for a ready server moved onto a model path not there yet (its restart held):
    the hold's recheck releases it, and the watch's report, while the old worker still stops and
    once the new one runs, starts nothing more."""
    a = make_entry("a", free_port())
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    old = bring_up(supervisor, spawner, "a", 1.0)
    path = tmp_path / "models" / "next"
    moved = make_entry("a", a.port, model=str(path))
    supervisor.apply(diff(config_of(a), config_of(moved)), {"a": moved}, now=2.0)
    assert "a" in supervisor.held
    move_into_place(path)
    supervisor.tick(3.0)  # the hold's recheck: released, the old worker stops
    assert "a" not in supervisor.held and old.signals == [signal.SIGTERM]
    assert supervisor.model_changed(["a"], present=True, now=3.5) == []  # its start is queued
    supervisor.on_message(m.ChildExited("a", spawner.latest("a")[0], 0), 4.0)
    assert len(spawner.children) == 2 and supervisor.servers["a"].entry.model == str(path)
    assert supervisor.model_changed(["a"], present=True, now=4.5) == []  # started from it
    supervisor.tick(5.0)
    assert len(spawner.children) == 2 and names_of(events, "server_starting") == ["a", "a"]


def test_a_waiting_server_whose_model_is_moved_into_place_is_spawned_once(tmp_path: Path) -> None:
    """Real daemon, stand-in worker: the model is renamed into place and a reload (SIGHUP) makes the
    waiting server look at once, well before the watch's report a second later: one worker."""
    h = DaemonHarness(tmp_path / "d")
    path = tmp_path / "models" / "next"
    path.parent.mkdir(parents=True)
    h.write({"alpha": entry(free_port(), model=str(path))})
    try:
        h.start()
        h.wait_states({"alpha": "waiting"})
        mark = h.mark()
        move_into_place(path)
        h.signal(signal.SIGHUP)
        changed = h.wait_event("model_changed", after=mark, timeout=60)
        assert (
            changed["directory"] == str(watch_path(path)) and changed["present"] is True and changed["restarted"] == []
        )
        wait_for(lambda: h.server("alpha")["state"] == "ready", 60, "alpha ready")
        assert len(h.events("server_starting", server="alpha")) == 1, h.events("server_starting")
        assert h.server("alpha")["starts"] == 1
    finally:
        h.cleanup()
