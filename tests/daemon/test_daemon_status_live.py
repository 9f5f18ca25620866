"""`veloxd status` while the state file cannot be written shows the daemon's live view.

The state directory becomes read-only (root: a read-only bind mount; others: mode 0555), a worker
is killed and restarted: the file keeps the dead pid, but `status` asks the daemon over its
control socket and shows the new one, saying the file cannot be written. A daemon whose state
file was never written (started on a full disk) is asked too, not reported as never run. Real
daemon, stand-in workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry, wait_for
from tests.support import free_port


def make_read_only(directory: Path) -> str:
    """Make `directory` unwritable for this process, in a way root obeys too; the error to expect."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return "Permission denied"
    for args in (["--bind", str(directory), str(directory)], ["-o", "remount,ro,bind", str(directory)]):
        if subprocess.run(["mount", *args], capture_output=True).returncode != 0:
            subprocess.run(["umount", str(directory)], check=False)
            pytest.skip("a read-only bind mount needs CAP_SYS_ADMIN; mode 0555 does not stop root")
    return "Read-only file system"


def make_writable(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["umount", str(directory)], check=False)
    directory.chmod(0o700)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[DaemonHarness]:
    """A real daemon with one stand-in server, `alpha`, ready."""
    harness = DaemonHarness(tmp_path)
    harness.write({"alpha": entry(free_port())})
    try:
        harness.start()
        harness.wait_states({"alpha": "ready"})
        yield harness
    finally:
        harness.cleanup()


def test_status_shows_the_live_pid_while_the_state_file_cannot_be_written(h: DaemonHarness) -> None:
    old = h.server("alpha")["pid"]
    error = make_read_only(h.state_dir)
    try:
        mark = h.mark()
        os.kill(old, signal.SIGKILL)
        failed = h.wait_event("state_write_failed", after=mark, timeout=60)
        assert error in failed["error"]
        ready = h.wait_event("server_ready", after=mark, server="alpha")
        assert h.server("alpha")["pid"] == old  # the file is stale
        status = h.cli("status")
        row = next(line.split() for line in status.stdout.splitlines() if line.startswith("alpha "))
        assert row[1] == "ready" and row[2] == str(ready["pid"]) and row[6] == "1", status.stdout
        assert "state file: cannot be written (" in status.stdout and error in status.stdout
        assert status.returncode == 0
        shown = json.loads(h.cli("status", "--json").stdout)
        assert shown["servers"]["alpha"]["pid"] == ready["pid"]
    finally:
        make_writable(h.state_dir)
    wait_for(lambda: h.server("alpha")["pid"] == ready["pid"], 60, "the state file written again")
    wait_for(lambda: not h.state()["daemon"]["state_write_error"], 60, "the error cleared in the file")
    assert "state file: cannot be written" not in h.cli("status").stdout


def test_status_asks_a_running_daemon_that_has_no_state_file(h: DaemonHarness) -> None:
    """A daemon started on a full disk never writes its state file; `status` still finds it through
    its control socket (stood in for here by a directory where the file should be: every write fails)."""
    old = h.server("alpha")["pid"]
    state_file = h.state_dir / "state.json"
    state_file.unlink()
    state_file.mkdir()
    (state_file / "keep").write_text("a directory, not a file: os.replace onto it fails")
    mark = h.mark()
    os.kill(old, signal.SIGKILL)
    h.wait_event("state_write_failed", after=mark, timeout=60)
    ready = h.wait_event("server_ready", after=mark, server="alpha")
    status = h.cli("status")
    assert "no state file" not in status.stderr, status.stderr
    row = next(line.split() for line in status.stdout.splitlines() if line.startswith("alpha "))
    assert row[1] == "ready" and row[2] == str(ready["pid"]), status.stdout
    assert "state file: cannot be written (" in status.stdout and status.returncode == 0
    assert json.loads(h.cli("status", "--json").stdout)["servers"]["alpha"]["pid"] == ready["pid"]
    logs = h.cli("logs", "-n", "50")  # finds the log the daemon writes by asking it, too
    assert logs.returncode == 0 and "no daemon is running" not in logs.stderr, logs.stderr
    assert any(json.loads(line).get("event") == "server_ready" for line in logs.stdout.splitlines()), logs.stdout
