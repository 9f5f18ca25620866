"""The download phase inside the supervisor, on a fake clock with a fake spawner: which state each
verdict of the download step leads to, when ready_timeout_s starts, how progress is throttled."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import structlog

from tests.fixtures.fake_spawner import FakeSpawner, config_of, make_entry
from tests.support import free_port
from veloxd.config.plan import diff
from veloxd.daemon import messages as m
from veloxd.daemon.server import ServerProcess
from veloxd.daemon.state import ServerState
from veloxd.daemon.supervisor import Supervisor
from veloxd.download.protocol import EXIT_FATAL, EXIT_RETRY

S = ServerState


def setup(tmp_path: Path, **extra: Any) -> tuple[Supervisor, FakeSpawner, Any]:
    spawner = FakeSpawner()
    sup = Supervisor(spawner, structlog.get_logger("test"))
    entry = make_entry("a", free_port(), model="o/m", env={"HF_HOME": str(tmp_path / "empty")}, **extra)
    sup.apply(diff(None, config_of(entry)), {"a": entry}, now=0.0)
    return sup, spawner, entry


def line(sup: Supervisor, spawner: FakeSpawner, now: float, **payload: Any) -> None:
    spawn_id, _ = spawner.latest("a")
    sup.on_message(m.DownloadLine("a", spawn_id, payload), now)


def state(server: ServerProcess) -> ServerState:
    """The server's state now: read through a call, as mypy keeps `server.state` narrowed by an earlier
    assert across the supervisor calls that change it."""
    return server.state


def exit_step(sup: Supervisor, spawner: FakeSpawner, code: int, now: float) -> None:
    spawn_id, child = spawner.latest("a")
    child.returncode = code
    sup.on_message(m.ChildExited("a", spawn_id, code), now)


def test_download_then_the_worker_with_the_ready_timeout_from_then(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as events:
        sup, spawner, _ = setup(tmp_path, ready_timeout_s=30)
        server = sup.servers["a"]
        assert state(server) is S.DOWNLOADING and spawner.latest("a")[1].argv[:3] == [
            "veloxd",
            "pull",
            "--progress-json",
        ]
        assert server.next_deadline() is None  # no timeout while downloading
        line(sup, spawner, 1.0, event="plan", revision="c" * 40, files=2, total_bytes=1000, local_bytes=0)
        for second in range(2, 600):  # ten minutes at 1.6 bytes/s: far longer than ready_timeout_s
            line(sup, spawner, float(second), event="progress", done_bytes=second * 1000 // 600, total_bytes=1000)
            sup.tick(float(second))
        assert state(server) is S.DOWNLOADING and server.snapshot()["download"]["percent"] == 99.8
        line(sup, spawner, 600.0, event="done", total_bytes=1000, fetched_bytes=1000, revision="c" * 40, path="/p")
        exit_step(sup, spawner, 0, 600.5)
        assert state(server) is S.STARTING and spawner.latest("a")[1].argv[:2] == ["veloxd", "serve"]
        assert server.next_deadline() == 600.5 + 30  # the ready timeout starts with loading
        assert server.snapshot()["download"] is None and server.snapshot()["restarts"] == 0
    progress = [e for e in events if e["event"] == "server_downloading" and "done_bytes" in e]
    assert 20 <= len(progress) <= 80  # every 5 % or 10 s, not one per line
    done = next(e for e in events if e["event"] == "server_downloaded")
    assert done["download_s"] == 600.5 and done["size_bytes"] == 1000


def test_a_fatal_verdict_is_fatal_at_once_with_the_message(tmp_path: Path) -> None:
    sup, spawner, _ = setup(tmp_path)
    line(sup, spawner, 1.0, event="failed", reason="gated", message="o/m is a gated model: accept its terms")
    exit_step(sup, spawner, EXIT_FATAL, 1.5)
    server = sup.servers["a"]
    assert state(server) is S.FATAL and server.fatal_reason == "o/m is a gated model: accept its terms"
    assert len(spawner.children) == 1  # no retry, no worker


def test_an_unreachable_hub_or_a_full_disk_waits_and_heals_never_fatal(tmp_path: Path) -> None:
    """Conditions of the world, not failures (an audit found a 17 s hub outage made an entry FATAL for
    good): the entry waits, naming the cause, looks again on the recheck schedule (1 s doubling,
    capped), counts no failure, and the download that works at last starts the worker."""
    sup, spawner, _ = setup(tmp_path)
    server = sup.servers["a"]
    now = 1.0
    causes = [("network", EXIT_RETRY, "cannot reach the hub; retrying"), ("no_space", EXIT_FATAL, "the disk is full")]
    for attempt in range(12):  # far past max_failures (3 here)
        reason, code, message = causes[attempt % 2]
        line(sup, spawner, now, event="failed", reason=reason, message=message)
        exit_step(sup, spawner, code, now)
        assert state(server) is S.WAITING and server.snapshot()["failures"] == 0, attempt
        assert [c.to_dict() for c in server.waiting_for] == [{"kind": "download", "key": "model", "message": message}]
        due = server.next_deadline()
        assert due is not None and due - now == min(30.0, 2.0**attempt)
        now = due
        sup.tick(now)
        assert state(server) is S.DOWNLOADING and len(spawner.children) == attempt + 2
    line(sup, spawner, now, event="done", total_bytes=10, fetched_bytes=10, revision="c" * 40, path="/p")
    exit_step(sup, spawner, 0, now)
    assert state(server) is S.STARTING and spawner.latest("a")[1].argv[:2] == ["veloxd", "serve"]


def test_stopping_during_a_download_terminates_the_step(tmp_path: Path) -> None:
    sup, spawner, _ = setup(tmp_path)
    sup.stop_all(1.0)
    _, step = spawner.latest("a")
    assert state(sup.servers["a"]) is S.STOPPING and step.signals == [signal.SIGTERM]
    exit_step(sup, spawner, -signal.SIGTERM, 1.2)
    assert state(sup.servers["a"]) is S.STOPPED
