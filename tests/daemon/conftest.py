"""Fixtures of the daemon tests: daemons a test starts (each in its own directory, all ended after),
and the in-process Supervisor over the recording spawner of tests/fixtures/fake_spawner.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
import structlog
from structlog.testing import capture_logs
from structlog.typing import EventDict

from tests.fixtures.daemon_harness import DaemonHarness
from veloxd.daemon.supervisor import Supervisor

if TYPE_CHECKING:
    from tests.fixtures.fake_spawner import FakeSpawner


class StartedDaemon(DaemonHarness):
    """A DaemonHarness that keeps the entries of its config (`servers`): a test edits them and writes them back."""

    def __init__(self, root: Path, servers: Mapping[str, dict[str, Any]], *, real_worker: bool = False) -> None:
        super().__init__(root, real_worker=real_worker)
        self.servers: dict[str, dict[str, Any]] = dict(servers)


class StartDaemon(Protocol):
    """The `start_daemon` fixture's function."""

    def __call__(
        self, servers: Mapping[str, dict[str, Any]], *, real_worker: bool = False, env: Mapping[str, str] | None = None
    ) -> StartedDaemon: ...


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[StartDaemon]:
    """`start_daemon(servers, real_worker=False, env=None)`: a running daemon with those entries.

    Stand-in workers unless `real_worker`; `env` is added to the daemon's (and so its workers')
    environment. Every daemon started, and every worker it spawned, is ended after the test.
    """
    started: list[StartedDaemon] = []

    def start(
        servers: Mapping[str, dict[str, Any]], *, real_worker: bool = False, env: Mapping[str, str] | None = None
    ) -> StartedDaemon:
        h = StartedDaemon(tmp_path / f"d{len(started)}", servers, real_worker=real_worker)
        h.write(h.servers)
        h.start(env=env)
        started.append(h)
        return h

    yield start
    for h in started:
        h.cleanup()


@pytest.fixture
def events() -> Iterator[list[EventDict]]:
    """The structlog events logged during the test."""
    with capture_logs() as captured:
        yield captured


@pytest.fixture
def spawner() -> FakeSpawner:
    """The recording stand-in for the daemon's process layer (a FakeSpawner)."""
    from tests.fixtures.fake_spawner import FakeSpawner

    return FakeSpawner()


@pytest.fixture
def supervisor(spawner: FakeSpawner) -> Supervisor:
    """The real Supervisor over `spawner`."""
    return Supervisor(spawner, structlog.get_logger("test"))
