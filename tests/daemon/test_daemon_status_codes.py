"""`veloxd status` fits on-demand servers: its exit code, RESTARTS and the crash's cause.

Each row of the exit-code table (veloxd/daemon/exitcodes.py) is tested on a state of that row;
docs/operations.md must show the table as the code has it; then a real daemon with a gateway and
stand-in workers: a stopped on-demand server exits 0, its on-demand starts and idle unloads are
starts, not restarts (status and /metrics), a crash is one, a FATAL entry says its worker's last
error line, and the console prints a crashed worker's traceback once.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, wait_for
from tests.gateway.support import GATEWAY, fake_entry, gateway_yaml, model_dir, post
from tests.support import REPO, free_port
from tests.web.support import Page
from veloxd.daemon.exitcodes import NOT_ANSWERING, TABLE, exit_code, markdown_table

ALIVE = {"daemon": {"running": True}, "last_reload": {"ok": True}, "degraded": False}


def server(state: str, start: str = "always", pending: str | None = None) -> dict[str, Any]:
    return {"state": state, "start": start, "pending": pending}


# One state file per row of TABLE, in its order; `alive` is whether the daemon's process runs.
ROW_EXAMPLES: list[tuple[dict[str, Any] | None, bool]] = [
    ({**ALIVE, "servers": {"a": server("ready")}}, False),
    ({**ALIVE, NOT_ANSWERING: "timed out", "servers": {"a": server("ready")}}, True),
    ({**ALIVE, "degraded": True, "servers": {}}, True),
    ({**ALIVE, "servers": {"a": server("ready", pending="restart"), "b": server("stopped", "on_demand")}}, True),
    ({**ALIVE, "servers": {"a": server("stopped"), "b": server("ready", "on_demand")}}, True),
    ({**ALIVE, "servers": {"a": server("ready"), "b": server("backoff", "on_demand")}}, True),
    ({**ALIVE, "servers": {"a": server("ready"), "b": server("stopped", "on_demand")}}, True),
]


@pytest.mark.parametrize("row", range(len(TABLE)), ids=[f"row{i}-exit{r[2]}" for i, r in enumerate(TABLE)])
def test_each_row_of_the_table_gives_its_code(row: int) -> None:
    state, alive = ROW_EXAMPLES[row]
    assert exit_code(state, alive) == TABLE[row][2]


def test_every_state_of_each_start_mode() -> None:
    """always: only ready is 0; on_demand: ready and stopped are 0; a refused reload is 3; no state is 1."""
    states = ("stopped", "downloading", "waiting", "starting", "ready", "backoff", "fatal", "stopping")
    for value in states:
        for start, fine in (("always", {"ready"}), ("on_demand", {"ready", "stopped"})):
            state = {**ALIVE, "servers": {"x": server(value, start)}}
            assert exit_code(state, True) == (0 if value in fine else 3), (value, start)
    refused = {**ALIVE, "last_reload": {"ok": False}, "servers": {"x": server("ready")}}
    assert exit_code(refused, True) == 3
    assert exit_code(None, False) == 1
    assert exit_code({**ALIVE, "servers": {"x": {"state": "ready"}}}, True) == 0  # no `start`: always


def test_docs_show_the_table_the_code_has() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    assert "## Status exit codes" in text
    assert markdown_table() in text, "docs/operations.md: paste veloxd.daemon.exitcodes.markdown_table()"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    h = DaemonHarness(tmp_path)
    yield h
    h.cleanup()


def test_on_demand_stopped_is_exit_0_and_its_starts_are_not_restarts(harness: DaemonHarness, tmp_path: Path) -> None:
    h = harness
    gateway = {"port": free_port()}
    servers = {
        "eager": fake_entry(model_dir(tmp_path, "e"), port=free_port()),
        "lazy": fake_entry(model_dir(tmp_path, "l"), port=free_port(), start="on_demand", idle_unload_s=1.0),
    }
    h.write(gateway_yaml(gateway, servers))
    h.start()
    h.wait_states({GATEWAY: "ready", "eager": "ready", "lazy": "stopped"})
    status = h.cli("status")
    assert status.returncode == 0, status.stdout
    base = f"http://127.0.0.1:{gateway['port']}"
    for _ in range(2):  # an on-demand start, an idle unload, twice
        mark = h.mark()
        assert post(base, "/v1/completions", {"model": "lazy", "prompt": "x"})[0] == 200
        h.wait_event("server_idle_unloaded", after=mark, server="lazy", timeout=60)
        h.wait_states({"lazy": "stopped"})
        assert h.cli("status").returncode == 0
    lazy = h.server("lazy")
    assert (lazy["restarts"], lazy["starts"], lazy["on_demand_starts"]) == (0, 2, 2)
    row = next(line.split() for line in h.cli("status").stdout.splitlines() if line.startswith("lazy "))
    assert row[1] == "stopped" and row[6] == "0"  # RESTARTS

    page = Page(h, gateway["port"], process=GATEWAY)  # the gateway serves /metrics too
    page.wait_metrics(
        ("veloxd_server_restarts_total", {"server": "lazy"}, 0),
        ("veloxd_server_starts_total", {"server": "lazy"}, 2),
        ("veloxd_server_on_demand_starts_total", {"server": "lazy"}, 2),
        ("veloxd_server_restarts_total", {"server": "eager"}, 0),
        ("veloxd_server_starts_total", {"server": "eager"}, 1),
    )

    # A crash of the on-demand server while it runs is a restart.
    assert post(base, "/v1/completions", {"model": "lazy", "prompt": "x"})[0] == 200
    pid = h.server("lazy")["pid"]
    assert pid is not None
    mark = h.mark()
    os.kill(pid, signal.SIGKILL)
    h.wait_event("server_ready", after=mark, server="lazy", timeout=60)
    assert (h.server("lazy")["restarts"], h.server("lazy")["on_demand_starts"]) == (1, 3)
    page.wait_value("veloxd_server_restarts_total", 1, server="lazy")

    # An always server that cannot start: exit 3, and status names its worker's own last line.
    servers["broken"] = fake_entry(model_dir(tmp_path, "b"), port=free_port(), env={"FAKE_EXIT_CODE": "3"})
    h.write(gateway_yaml(gateway, servers))
    h.wait_states({"broken": "fatal"})
    status = h.cli("status")
    assert status.returncode == 3
    assert "broken: 3 failures within 60s; last error: fake worker: failing with code 3" in status.stdout
    del servers["broken"]
    h.write(gateway_yaml(gateway, servers))
    wait_for(lambda: h.cli("status").returncode == 0, 60, "status exit 0 with broken removed")
    assert h.stop() == 0
    assert h.cli("status").returncode == 1


CRASHER = """
import sys
def load():
    raise RuntimeError("worker boom at load")
print("loading", flush=True)
load()
"""


def test_console_prints_a_crashed_workers_traceback_once(tmp_path: Path) -> None:
    """`veloxd run --log-format console`: a worker whose load raises crashes twice (max_failures 2);
    each traceback appears once on the console, not again under server_exited and server_fatal."""
    crasher = tmp_path / "crasher.py"
    crasher.write_text(CRASHER)
    h = DaemonHarness(tmp_path / "d")
    h.worker_command = f"{sys.executable} {crasher}"
    restart = {"max_failures": 2, "window_s": 60, "backoff_initial_s": 0.1, "backoff_max_s": 0.1}
    h.write({"alpha": fake_entry(model_dir(tmp_path, "m"), port=free_port(), restart=restart)})
    try:
        h.start("--log-format", "console")
        h.wait_states({"alpha": "fatal"})
        fatal = h.events("server_fatal", server="alpha")[-1]
        assert "RuntimeError: worker boom at load" in str(fatal["last_lines"])  # the JSON log keeps it all
        h.stop()
        console = h.output.read_text()
        assert console.count("Traceback (most recent call last)") == 2, console[-3000:]
        assert console.count('raise RuntimeError("worker boom at load")') == 2
        assert console.count("RuntimeError: worker boom at load\n") == 2  # the traceback's own last line
        exited = [line for line in console.splitlines() if "server_exited" in line]
        assert len(exited) == 2 and all("last_error='RuntimeError: worker boom at load'" in x for x in exited)
    finally:
        h.cleanup()


def test_a_daemon_that_does_not_answer_is_not_up(harness: DaemonHarness, tmp_path: Path) -> None:
    """SIGSTOP: the process lives but cannot act; status shows its last state file and exits 3."""
    h = harness
    h.write(gateway_yaml({"port": free_port()}, {"eager": fake_entry(model_dir(tmp_path, "e"), port=free_port())}))
    h.start()
    h.wait_states({GATEWAY: "ready", "eager": "ready"})
    assert h.cli("status").returncode == 0
    assert h.proc is not None
    os.kill(h.proc.pid, signal.SIGSTOP)
    try:
        status = h.cli("status")
    finally:
        os.kill(h.proc.pid, signal.SIGCONT)
    assert status.returncode == 3, status.stdout
    assert "NOT ANSWERING on its control socket" in status.stdout.splitlines()[0]
    assert "the daemon did not answer" in status.stderr
    wait_for(lambda: h.cli("status").returncode == 0, 60, "status exit 0 once the daemon runs again")
