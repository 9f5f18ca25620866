"""Start-up of the real daemon when its files are in the way, its socket location, the degraded
start's wording, and a starting worker's lifeline."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_gone
from tests.support import REPO, free_port, veloxd_cmd


def run_daemon(h: DaemonHarness, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = veloxd_cmd("run", "--config", str(h.config), "--log-file", str(h.log_file), "--state-dir", str(h.state_dir))
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("veloxd run: error: ")
    return line


def test_state_dir_that_is_a_file_is_one_line_naming_it(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    h.write({})
    h.state_dir.write_text("in the way")
    line = one_line_error(run_daemon(h))
    assert f"state directory {h.state_dir} exists but is not a directory" in line and "--state-dir" in line


def test_state_dir_under_a_file_is_one_line_naming_it(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    h.write({})
    (tmp_path / "blocker").write_text("")
    h.state_dir = tmp_path / "blocker" / "state"
    line = one_line_error(run_daemon(h))
    assert f"state directory {h.state_dir} is not usable (Not a directory)" in line


@pytest.mark.parametrize("what", ["closed", "regular file"])
def test_a_lifeline_fd_that_is_not_a_pipe_is_one_line_naming_it(tmp_path: Path, what: str) -> None:
    h = DaemonHarness(tmp_path)
    h.write({})
    with open(tmp_path / "not-a-pipe", "w") as held:
        fd = held.fileno() if what == "regular file" else 1000  # nothing is open at 1000 in the child
        argv = veloxd_cmd(
            "run", "--config", str(h.config), "--log-file", str(h.log_file), "--state-dir", str(h.state_dir)
        )
        done = subprocess.run(
            [*argv, "--lifeline-fd", str(fd)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            pass_fds=(fd,) if what == "regular file" else (),
        )
    line = one_line_error(done)
    assert line.startswith(f"veloxd run: error: --lifeline-fd {fd}: "), line
    assert ("not an open descriptor" if what == "closed" else "not a pipe or socket") in line, line


def test_something_at_the_socket_path_is_one_line_naming_it(tmp_path: Path) -> None:
    """Anything already at the socket's name used to stop the start with IsADirectoryError."""
    h = DaemonHarness(tmp_path)
    h.write({})
    h.state_dir.mkdir(mode=0o700)
    (h.state_dir / "control.sock").mkdir()
    line = one_line_error(run_daemon(h))
    assert f"cannot create the control socket {h.state_dir.resolve()}/control.sock: a directory is in the way" in line


def test_long_state_dir_gets_a_private_unpredictable_socket_directory(tmp_path: Path) -> None:
    """A state dir too long for a unix socket used to fall back to a predictable name in the
    temp dir that anyone could take first. Now: a fresh 0700 directory of ours, recorded in the state
    file, used by the CLI, removed when the daemon stops."""
    h = DaemonHarness(tmp_path)
    h.state_dir = tmp_path / ("s" * 120) / "state"
    h.write({"solo": entry(free_port())})
    squatter = Path(tempfile.gettempdir()) / f"veloxd-{os.getuid()}-{'0' * 12}.sock"
    try:
        h.start()
        h.wait_states({"solo": "ready"})
        path = Path(h.state()["daemon"]["control_socket"])
        assert path.name == "control.sock" and path.parent.parent == Path(tempfile.gettempdir())
        info = path.parent.lstat()
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        assert path.parent.name.startswith(f"veloxd-{os.getuid()}-") and not squatter.exists()
        assert h.cli("reload").returncode == 0
        assert h.stop() == 0
        assert not path.parent.exists()
    finally:
        h.cleanup()


def test_degraded_start_does_not_claim_a_last_good_config(tmp_path: Path) -> None:
    """With no valid config ever, status says no server runs (not 'kept the last good
    config'), `reload` says the same, and status exits 3 (running, not as configured)."""
    h = DaemonHarness(tmp_path)
    h.write("version: 1\nservers:\n  a: {port: 0}\n")
    try:
        h.start()
        h.wait_event("config_reload_failed")
        status = h.cli("status")
        assert "FAILED, and no config was valid before: no server runs" in status.stdout
        assert "kept the last good config" not in status.stdout and status.returncode == 3
        reload = h.cli("reload")
        assert reload.returncode == 1 and "none was valid before: no server runs" in reload.stderr
    finally:
        h.cleanup()


@pytest.mark.slow
def test_starting_worker_leaves_when_the_daemon_is_killed(tmp_path: Path) -> None:
    """The worker watches the lifeline from its first moment (before importing MLX), so a
    SIGKILLed daemon takes a still-starting worker with it."""
    h = DaemonHarness(tmp_path, real_worker=True)
    h.write({"slow": entry(free_port(), model=str(REPO / "veloxd" / "assets" / "tiny-llama"), ready_timeout_s=300)})
    try:
        h.start()
        starting = h.wait_event("server_starting", server="slow", timeout=60)
        pid = starting["pid"]
        assert pid_alive(pid)
        h.signal(signal.SIGKILL)
        assert h.proc is not None
        h.proc.wait(30)
        wait_gone([pid], 60)
        assert not h.events("server_ready")
    finally:
        h.cleanup()


def test_a_refusal_is_not_cached_a_chmod_alone_gets_the_file_accepted(tmp_path: Path) -> None:
    """Verdicts that depend on the world: a file refused because others can write it is
    accepted once `chmod go-w` fixes it, with its bytes unchanged: the poll sees the mode change,
    and `veloxd reload` re-reads a refused file rather than repeating a verdict cached by hash."""
    h = DaemonHarness(tmp_path)
    h.write({"solo": entry(free_port())})
    h.config.chmod(0o666)
    try:
        h.start()
        failed = h.wait_event("config_reload_failed")
        assert any("writable by group and others" in line for line in failed["error_lines"])
        again = h.cli("reload")
        assert again.returncode == 1 and "writable by group and others" in again.stderr
        h.config.chmod(0o644)
        h.wait_states({"solo": "ready"})
        assert h.events("config_reloaded") and h.cli("status").returncode == 0
    finally:
        h.cleanup()
