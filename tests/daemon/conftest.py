"""Fixtures of the daemon tests: daemons a test starts (each in its own directory, all ended after),
and the in-process Supervisor over the recording spawner of test_supervisor_inprocess.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from tests.fixtures.daemon_harness import DaemonHarness
from veloxd.daemon.supervisor import Supervisor


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonHarness]]:
    """`start_daemon(servers, real_worker=False, env=None)`: a running daemon with those entries.

    Stand-in workers unless `real_worker`; `env` is added to the daemon's (and so its workers')
    environment. Every daemon started, and every worker it spawned, is ended after the test.
    """
    started: list[DaemonHarness] = []

    def start(
        servers: Mapping[str, dict[str, Any]], *, real_worker: bool = False, env: Mapping[str, str] | None = None
    ) -> DaemonHarness:
        h = DaemonHarness(tmp_path / f"d{len(started)}", real_worker=real_worker)
        h.servers = dict(servers)  # type: ignore[attr-defined]
        h.write(h.servers)  # type: ignore[attr-defined]
        h.start(env=env)
        started.append(h)
        return h

    yield start
    for h in started:
        h.cleanup()


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    """The structlog events logged during the test."""
    with capture_logs() as captured:
        yield captured


@pytest.fixture
def spawner() -> Any:
    """The recording stand-in for the daemon's process layer (a FakeSpawner)."""
    from tests.daemon.test_supervisor_inprocess import FakeSpawner

    return FakeSpawner()


@pytest.fixture
def supervisor(spawner: Any) -> Supervisor:
    """The real Supervisor over `spawner`."""
    return Supervisor(spawner, structlog.get_logger("test"))
