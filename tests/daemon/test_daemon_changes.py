"""The change count the daemon writes its state file by: every step that changes what the file
shows moves it, and a step that changes nothing leaves it (so nothing is rebuilt or rewritten).

The real Supervisor and ServerProcess on a fake clock, with the recording spawner of
tests/fixtures/fake_spawner.py; after each step the snapshot (the file's `servers`)
is compared with the one before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from tests.fixtures.fake_spawner import FakeSpawner, config_of, make_entry, ready_line, state_of
from tests.support import free_port
from veloxd.config.plan import diff
from veloxd.daemon import messages as m
from veloxd.daemon.state import ServerState
from veloxd.daemon.supervisor import Supervisor

S = ServerState
HEALTH = {"interval_s": 10.0, "timeout_s": 2.0, "failures": 3}


class Ledger:
    """Steps a supervisor and checks, after each, that a changed snapshot came with a moved count."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.count = supervisor.changes.count
        self.snapshot = supervisor.snapshot()
        self.kinds: list[str] = []

    def step(self, what: str) -> str:
        count, snapshot = self.supervisor.changes.count, self.supervisor.snapshot()
        if snapshot != self.snapshot:
            assert count != self.count, f"{what}: the snapshot changed, the count did not (the file would be stale)"
            kind = "change"
        else:
            kind = "same" if count == self.count else "bumped"
        self.count, self.snapshot = count, snapshot
        self.kinds.append(kind)
        return kind


def new_supervisor() -> tuple[Supervisor, FakeSpawner]:
    spawner = FakeSpawner()
    return Supervisor(spawner, structlog.get_logger("test")), spawner


def test_every_change_of_a_servers_life_moves_the_count_and_idle_steps_do_not() -> None:
    supervisor, spawner = new_supervisor()
    ledger = Ledger(supervisor)
    a = make_entry("a", free_port(), health=dict(HEALTH))
    supervisor.apply(diff(None, config_of(a)), {"a": a}, now=0.0)
    assert ledger.step("started") == "change"
    spawn_id, child = spawner.latest("a")
    supervisor.on_message(m.ReadyLine("a", spawn_id, ready_line(supervisor, "a")), 1.0)
    assert ledger.step("READY line") == "change"
    supervisor.on_message(m.Healthy("a", spawn_id), 1.0)
    assert ledger.step("healthy") == "change"
    assert state_of(supervisor.servers["a"]) is S.READY
    for now in (2.0, 5.0, 10.9):
        supervisor.tick(now)
        assert ledger.step(f"tick at {now}") == "same"
    supervisor.on_message(m.Healthy("a", spawn_id - 1), 10.9)  # a stale report
    supervisor.on_message(m.ReadyLine("a", spawn_id + 1, {}), 10.9)  # not this worker's
    assert ledger.step("stale reports") == "same"
    supervisor.tick(11.0)
    assert ledger.step("probe started") == "change"  # health.probes
    supervisor.on_message(m.HealthProbed("a", spawn_id, 1, None), 11.5)
    assert ledger.step("probe answered") == "same"  # no failures before, none now
    supervisor.tick(21.5)
    supervisor.on_message(m.HealthProbed("a", spawn_id, 2, "no answer within 2 s"), 23.5)
    assert ledger.step("probe failed") == "change"
    slower = make_entry("a", a.port, health=dict(HEALTH), stop_timeout_s=9)
    supervisor.apply(diff(config_of(a), config_of(slower)), {"a": slower}, now=24.0)
    assert ledger.step("live update") == "change" and state_of(supervisor.servers["a"]) is S.READY
    child.returncode = 1
    supervisor.on_message(m.ChildExited("a", spawn_id, 1), 25.0)
    assert ledger.step("crashed") == "change" and state_of(supervisor.servers["a"]) is S.BACKOFF
    supervisor.tick(25.5)
    assert ledger.step("backoff not over") == "same"
    supervisor.tick(26.0)
    assert ledger.step("retried") == "change" and state_of(supervisor.servers["a"]) is S.STARTING
    spawn_id, child = spawner.latest("a")
    supervisor.restart(["a"], "restart_requested", 27.0)
    assert ledger.step("restart asked") == "change" and supervisor.snapshot()["a"]["pending"] == "restart"
    child.returncode = 0
    supervisor.on_message(m.ChildExited("a", spawn_id, 0), 27.5)
    assert ledger.step("restarted") == "change" and supervisor.snapshot()["a"]["pending"] is None
    supervisor.stop_all(28.0)
    assert ledger.step("stopping") == "change"
    spawn_id, child = spawner.latest("a")
    child.returncode = 0
    supervisor.on_message(m.ChildExited("a", spawn_id, 0), 28.5)
    assert ledger.step("stopped") == "change" and supervisor.all_stopped()
    supervisor.tick(100.0)
    assert ledger.step("idle") == "same"


def test_download_reports_move_the_count(tmp_path: Path) -> None:
    supervisor, spawner = new_supervisor()
    entry = make_entry("a", free_port(), model="o/m", env={"HF_HOME": str(tmp_path / "empty")})
    supervisor.apply(diff(None, config_of(entry)), {"a": entry}, now=0.0)
    ledger = Ledger(supervisor)
    assert supervisor.servers["a"].state is S.DOWNLOADING
    spawn_id, _ = spawner.latest("a")
    payloads: list[dict[str, Any]] = [
        {"event": "plan", "revision": "r", "local_bytes": 0, "total_bytes": 1000},
        {"event": "progress", "done_bytes": 400, "total_bytes": 1000},
        {"event": "progress", "done_bytes": 900, "total_bytes": 1000},
    ]
    for now, payload in enumerate(payloads, start=1):
        supervisor.on_message(m.DownloadLine("a", spawn_id, payload), float(now))
        assert ledger.step(payload["event"]) == "change"
    assert supervisor.snapshot()["a"]["download"]["done_bytes"] == 900
    supervisor.on_message(m.DownloadLine("a", spawn_id + 1, payloads[-1]), 4.0)  # another spawn's
    assert ledger.step("stale line") == "same"
