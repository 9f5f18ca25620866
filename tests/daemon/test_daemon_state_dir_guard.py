"""A removed lock file or state directory does not let a second daemon take over a running one.

The first daemon (A) is stopped with SIGSTOP while its files are removed, so nothing it does on
its own can race the second daemon (B): B must refuse on what it finds (A's recorded pid and start
time, A's control socket answering), end none of A's workers and leave A's socket alone. Once A
runs again it makes its state directory, lock file and control socket again on its poll tick.
Real daemons, stand-in workers; the orphan rule and the socket's own check run in process on real
processes and sockets.
"""

from __future__ import annotations

import fcntl
import os
import queue
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog
from structlog.typing import EventDict

from tests.daemon.conftest import StartDaemon, StartedDaemon
from tests.fixtures.daemon_harness import DEADLINE_S, entry, pid_alive, wait_for
from tests.support import free_port
from veloxd.daemon.control import ControlServer, request_at
from veloxd.daemon.orphans import end_orphans
from veloxd.daemon.process import process_start_time
from veloxd.daemon.statefile import StartupError


def ready_daemon(start_daemon: StartDaemon) -> tuple[StartedDaemon, int]:
    """A daemon with one ready stand-in worker, and that worker's pid."""
    h = start_daemon({"a": entry(free_port())})
    return h, h.wait_states({"a": "ready"})["a"]["pid"]


@contextmanager
def stopped(h: StartedDaemon) -> Iterator[int]:
    """The daemon stopped with SIGSTOP (its pid yielded) until the block ends: it does nothing on its
    own meanwhile, while the kernel still queues connections to its control socket."""
    assert h.proc is not None
    h.signal(signal.SIGSTOP)
    try:
        process = psutil.Process(h.proc.pid)
        wait_for(lambda: process.status() == psutil.STATUS_STOPPED, DEADLINE_S, "the daemon to stop")
        yield h.proc.pid
    finally:
        h.signal(signal.SIGCONT)


def second_daemon(h: StartedDaemon) -> subprocess.CompletedProcess[str]:
    """`veloxd run` on the same config and state dir (its own log file); it is expected to exit."""
    assert h.worker_command is not None
    log = str(h.root / "second.jsonl")
    return h.cli(
        "run", "--config", str(h.config), "--log-file", log, "--worker-command", h.worker_command, timeout=DEADLINE_S
    )


def lock_is_held(path: Path) -> bool:
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False


def held_again_by(h: StartedDaemon, pid: int) -> None:
    """Until the lock file names `pid` again and is locked (by the daemon: this process holds none)."""
    lock = h.state_dir / "daemon.lock"
    wait_for(lambda: lock.exists() and lock.read_text() == str(pid) and lock_is_held(lock), DEADLINE_S, "the lock")


def test_a_second_daemon_refuses_while_the_recorded_one_lives_after_its_lock_file_was_removed(
    start_daemon: StartDaemon,
) -> None:
    """B takes a fresh lock, but the state file's daemon is still that process: B exits 1 with one
    line naming A's pid and the removed lock file, A's worker and socket are untouched; A takes its
    lock back (B left its own file in the place: replaced)."""
    h, worker = ready_daemon(start_daemon)
    control = h.state_dir / "control.sock"
    before = control.stat().st_ino
    mark = h.mark()
    with stopped(h) as daemon_pid:
        (h.state_dir / "daemon.lock").unlink()
        second = second_daemon(h)
        assert second.returncode == 1, second
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1, second.stderr
        assert f"another veloxd daemon (pid {daemon_pid}) is running" in line
        assert f"its lock file {h.state_dir / 'daemon.lock'} was removed" in line
        assert pid_alive(worker) and control.stat().st_ino == before
    recreated = h.wait_event("lock_file_recreated", after=mark)
    assert recreated["reason"] == "replaced" and recreated["level"] == "warning"
    held_again_by(h, daemon_pid)
    assert request_at(control, {"command": "status"})["state"]["servers"]["a"]["pid"] == worker


def test_a_second_daemon_refuses_while_the_control_socket_answers(start_daemon: StartDaemon) -> None:
    """No lock file and no state file, but A's control socket accepts a connection: B refuses,
    naming A's pid as the OS gives it for the listening socket, and does not remove the socket.
    A writes its state file again and takes its lock back."""
    h, worker = ready_daemon(start_daemon)
    control = h.state_dir / "control.sock"
    before = control.stat().st_ino
    with stopped(h) as daemon_pid:
        (h.state_dir / "daemon.lock").unlink()
        (h.state_dir / "state.json").unlink()
        second = second_daemon(h)
        assert second.returncode == 1, second
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1, second.stderr
        if sys.platform in ("linux", "darwin"):  # where the OS names a unix socket's peer
            assert f"another veloxd daemon (pid {daemon_pid}) is running" in line
        assert "lock file" in line and "was removed" in line
        assert control.stat().st_ino == before
    held_again_by(h, daemon_pid)
    state = wait_for(lambda: h.state().get("daemon"), DEADLINE_S, "the state file written again")
    assert state["pid"] == daemon_pid and pid_alive(worker)


def test_the_daemon_makes_its_removed_state_dir_again(start_daemon: StartDaemon) -> None:
    """`rm -rf` of the state directory: on its poll tick the daemon makes it again (0700), takes a
    new lock with its pid, listens on its control socket again and writes its state file; a second
    daemon is then refused by the lock as usual, and no worker was touched."""
    h, worker = ready_daemon(start_daemon)
    mark = h.mark()
    with stopped(h) as daemon_pid:
        shutil.rmtree(h.state_dir)  # nothing is written into it meanwhile
    made = h.wait_event("state_dir_recreated", after=mark)
    assert made["state_dir"] == str(h.state_dir) and made["level"] == "warning"
    assert h.wait_event("lock_file_recreated", after=mark)["reason"] == "missing"
    rebound = h.wait_event("control_socket_rebound", after=mark)
    assert rebound["control_socket"] == str(h.state_dir.resolve() / "control.sock")
    assert h.state_dir.stat().st_mode & 0o777 == 0o700
    held_again_by(h, daemon_pid)
    wait_for(lambda: h.state().get("daemon", {}).get("pid") == daemon_pid, DEADLINE_S, "the state file again")
    status = h.cli("status")
    assert status.returncode == 0, status
    second = second_daemon(h)
    assert second.returncode == 1 and f"another veloxd daemon (pid {daemon_pid}) is running" in second.stderr
    assert h.server("a")["pid"] == worker and pid_alive(worker)


def test_a_daemon_that_lost_its_lock_says_so_keeps_serving_and_takes_it_back(start_daemon: StartDaemon) -> None:
    """Another process holds a new lock file in the old one's place: the daemon logs `lock_lost`
    naming the holder once, keeps answering, and takes the lock once it is free."""
    h, worker = ready_daemon(start_daemon)
    assert h.proc is not None
    lock = h.state_dir / "daemon.lock"
    mark = h.mark()
    with open(h.state_dir / "other.lock", "w") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        other.write(str(os.getpid()))
        other.flush()
        os.replace(h.state_dir / "other.lock", lock)  # never missing: the daemon sees it replaced
        lost = h.wait_event("lock_lost", after=mark)
        assert lost["level"] == "error" and lost["holder"] == str(os.getpid())
        assert lost["lock_file"] == str(lock)
        status = h.cli("status")  # still serving, through its control socket
        assert status.returncode == 0 and "a" in status.stdout, status
    recreated = h.wait_event("lock_file_recreated", after=mark)
    assert recreated["reason"] == "replaced"
    held_again_by(h, h.proc.pid)
    assert len(h.events("lock_lost")) == 1  # once, not on every poll tick
    assert h.server("a")["pid"] == worker and pid_alive(worker)


def sleeper(**popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], **popen)


def test_workers_of_a_daemon_that_still_runs_are_not_orphans(events: list[EventDict]) -> None:
    """The previous state file's daemon is still that process: its worker is spared. Once that
    daemon is gone, the same worker is an orphan and is ended."""
    daemon, worker = sleeper(), sleeper(start_new_session=True)
    try:
        state = {
            "daemon": {"pid": daemon.pid, "start_time": process_start_time(daemon.pid), "running": True},
            "servers": {
                "a": {"pid": worker.pid, "pgid": worker.pid, "start_time": process_start_time(worker.pid)},
            },
        }
        assert end_orphans(state, structlog.get_logger("test")) == []
        assert worker.poll() is None
        spared = [e for e in events if e["event"] == "orphans_spared"]
        assert spared and spared[0]["daemon_pid"] == daemon.pid
        daemon.kill()
        daemon.wait()
        assert end_orphans(state, structlog.get_logger("test")) == [worker.pid]
        worker.wait(DEADLINE_S)
    finally:
        for process in (daemon, worker):
            process.kill()
            process.wait()


def test_the_control_socket_of_a_live_daemon_is_never_cleared_or_removed(tmp_path: Path) -> None:
    """A second server on the same path refuses while the first listens (naming its pid); a server
    whose path was taken over by another socket leaves that socket in place when it closes."""
    first = ControlServer(tmp_path, queue.SimpleQueue())
    try:
        with pytest.raises(StartupError, match=rf"another veloxd daemon \(pid {os.getpid()}\) still listens"):
            ControlServer(tmp_path, queue.SimpleQueue())
        first.path.unlink()  # e.g. its directory was removed and made again
        second = ControlServer(tmp_path, queue.SimpleQueue())
    finally:
        first.close()
    try:
        assert second.path.exists()  # the first one's close left the second one's socket alone
    finally:
        second.close()
    assert not second.path.exists()
