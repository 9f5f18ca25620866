"""WAITING: an entry whose world is not ready (model path, port, env var) waits, alone, and starts
by itself once it is. Decisions on a fake clock; the spawner is a recording stand-in."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.fixtures.fake_spawner import state_of
from veloxd.config import RestartPolicy
from veloxd.config.world import Condition
from veloxd.daemon.process import Child
from veloxd.daemon.server import ServerProcess
from veloxd.daemon.state import ServerState, recheck_delay
from veloxd.daemon.supervised import Supervised
from veloxd.daemon.supervisor import Supervisor

S = ServerState
PORT_HELD = Condition("port", ("port",), "port 9000 on 127.0.0.1 is already in use")
NO_MODEL = Condition("model_path", ("model",), "model path /m does not exist (yet)")


@dataclass(frozen=True)
class Entry:
    name: str = "a"
    host: str = "127.0.0.1"
    port: int = 9000
    method: str = "fp16"
    model: str = "/m"
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 5.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    env: dict[str, str] = field(default_factory=dict)
    # the rest of veloxd.daemon.supervised.Supervised: none of them in play here
    start: str = "always"
    api_key_env: str | None = None
    kv: None = None
    health: None = None
    distributed: None = None
    program: None = None

    def serve_argv(self) -> list[str]:
        return []


class FakeChild(Child):
    """A Child with no process behind it (Child's __init__, which spawns one, is not run)."""

    def __init__(self, pid: int) -> None:
        self.pid = self.pgid = pid
        self.argv = ["worker"]
        self.returncode: int | None = None
        self.start_time = "t"

    def signal_group(self, signum: int) -> bool:
        return True

    def release_output(self) -> None:
        pass  # no output to hold

    def last_lines(self) -> dict[str, list[str]]:
        return {"stdout": [], "stderr": []}


class Spawner:
    """Records the names it spawns; health probes go nowhere (no test here reaches READY by a probe)."""

    def __init__(self) -> None:
        self.spawned: list[str] = []

    def spawn(self, name: str, spawn_id: int, entry: Supervised) -> FakeChild:
        self.spawned.append(name)
        return FakeChild(1000 + len(self.spawned))

    def spawn_download(self, name: str, spawn_id: int, entry: Supervised) -> FakeChild:
        raise AssertionError(f"{name}: no entry here has a model to download")

    def probe_health(self, name: str, spawn_id: int, host: str, port: int, deadline: float) -> threading.Event:
        return threading.Event()

    def check_health(self, name: str, spawn_id: int, sequence: int, host: str, port: int, timeout: float) -> None:
        raise AssertionError(f"{name}: no entry here has a health section")


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def bind(self, **_: Any) -> Log:
        return self

    def __getattr__(self, level: str) -> Any:
        return lambda event, **keys: self.events.append((event, keys))


class World:
    """What the world lacks right now, changed by the test."""

    def __init__(self, *missing: Condition) -> None:
        self.missing = list(missing)
        self.looks = 0

    def __call__(self, entry: Supervised) -> list[Condition]:
        self.looks += 1
        return list(self.missing)


def test_recheck_schedule_is_backoff_like_and_capped() -> None:
    assert [recheck_delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]
    with pytest.raises(ValueError):
        recheck_delay(0)


def test_entry_waits_without_spawning_then_starts_once_the_condition_clears() -> None:
    """STOPPED -> WAITING (one server_waiting event naming the reason), rechecks on the schedule with
    no new events while nothing changes, then STARTING by itself when the world is ready."""
    world, spawner, log = World(PORT_HELD), Spawner(), Log()
    server = ServerProcess(Entry(), spawner, log, check_world=world)
    server.start(now=0.0)
    assert state_of(server) is S.WAITING and spawner.spawned == [] and server.next_deadline() == 1.0
    assert [e for e, _ in log.events] == ["server_waiting"]
    assert log.events[0][1]["reason"] == PORT_HELD.message
    assert server.snapshot()["waiting_reason"] == PORT_HELD.message
    server.tick(0.99)
    assert world.looks == 1
    server.tick(1.0)  # still held: look again after 2 s, silently
    assert state_of(server) is S.WAITING and world.looks == 2 and server.next_deadline() == 3.0
    assert len(log.events) == 1
    world.missing = []
    server.tick(3.0)
    assert state_of(server) is S.STARTING and spawner.spawned == ["a"]
    assert server.snapshot()["waiting_reason"] is None


def test_a_new_reason_is_logged_and_a_watch_makes_it_look_at_once() -> None:
    world, log = World(NO_MODEL), Log()
    server = ServerProcess(Entry(), Spawner(), log, check_world=world)
    server.start(0.0)
    world.missing = [PORT_HELD]
    server.tick(1.0)
    assert [k["reason"] for e, k in log.events if e == "server_waiting"] == [NO_MODEL.message, PORT_HELD.message]
    assert server.next_deadline() == 3.0
    server.recheck_soon(1.5)  # e.g. the model path's parent changed
    assert server.next_deadline() == 1.5


def test_waiting_entry_stops_at_once_and_a_backoff_retry_can_wait() -> None:
    world, spawner = World(), Spawner()
    server = ServerProcess(Entry(), spawner, Log(), check_world=world)
    server.start(0.0)
    server.on_exit(server.spawn_id, 1, now=1.0)  # a crash: BACKOFF
    assert state_of(server) is S.BACKOFF
    world.missing = [NO_MODEL]  # the model went away meanwhile
    server.tick(10.0)
    assert state_of(server) is S.WAITING and len(spawner.spawned) == 1
    server.stop(11.0)
    assert state_of(server) is S.STOPPED


def test_model_reappearing_revives_fatal_and_waiting_but_its_absence_stops_no_running_server() -> None:
    """While a model path is missing, servers that run keep serving what they loaded; FATAL ones are
    restarted (into WAITING, visibly). Once it is back, WAITING ones look again at once."""
    world, spawner = World(), Spawner()
    supervisor = Supervisor(spawner, Log())
    for name in ("ready", "fatal", "waiting"):
        server = supervisor.servers[name] = ServerProcess(Entry(name=name), spawner, Log(), check_world=world)
        server.start(0.0)
    supervisor.servers["ready"].on_healthy(supervisor.servers["ready"].spawn_id, 1.0)
    supervisor.servers["ready"].ready_payload = {}
    supervisor.servers["fatal"].on_exit(supervisor.servers["fatal"].spawn_id, 2, 1.0)  # unfixable: FATAL
    supervisor.servers["waiting"].stop(1.0)
    supervisor.servers["waiting"].on_exit(supervisor.servers["waiting"].spawn_id, 0, 1.0)
    world.missing = [NO_MODEL]
    supervisor.servers["waiting"].start(1.0)
    assert {n: s.state for n, s in supervisor.servers.items()} == {
        "ready": S.READY,
        "fatal": S.FATAL,
        "waiting": S.WAITING,
    }

    assert supervisor.model_changed(["ready", "fatal", "waiting"], present=False, now=2.0) == ["fatal"]
    assert state_of(supervisor.servers["fatal"]) is S.WAITING and state_of(supervisor.servers["ready"]) is S.READY
    world.missing = []
    assert supervisor.model_changed(["ready", "fatal", "waiting"], present=True, now=3.0) == ["ready"]
    assert supervisor.servers["fatal"].next_deadline() == 3.0  # looks again at the next tick
    supervisor.tick(3.0)
    assert state_of(supervisor.servers["fatal"]) is S.STARTING and state_of(supervisor.servers["waiting"]) is S.STARTING
