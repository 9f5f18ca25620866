"""The daemon's state file `<state_dir>/state.json` (atomic writes) and its single-instance lock.

Readers (`veloxd status`, `veloxd plan`, the next daemon's orphan check) never see a half
written file: it is written to a temporary file in the same directory and renamed over.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any

from veloxd.daemon.process import is_same_process
from veloxd.files import write_json_atomic

STATE_FILE = "state.json"
LOCK_FILE = "daemon.lock"
SCHEMA_VERSION = 1


class Changes:
    """Counts changes of what the state file shows; the daemon rewrites the file when the count moved.

    Bumped where such a fact changes (a server's one transition function, its READY line, download
    report, liveness probe, exit; a rollout queued or done; a reload; the daemon stopping), so a
    message that changes nothing (a status or gateway-view request, a timer with nothing due)
    neither rebuilds nor rewrites the state."""

    def __init__(self) -> None:
        self.count = 0

    def bump(self) -> None:
        self.count += 1


class StartupError(RuntimeError):
    """The daemon cannot start: one line naming the path and what to do (no traceback)."""


def state_path(state_dir: Path) -> Path:
    return Path(state_dir) / STATE_FILE


def ensure_state_dir(state_dir: Path) -> Path:
    """Create the state directory, private to the user (it holds the control socket), and prove it
    writable; StartupError naming the directory and what to do otherwise."""
    state_dir = Path(state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = state_dir.stat()
        if info.st_uid != os.getuid():
            raise StartupError(
                f"state directory {state_dir} belongs to uid {info.st_uid}, not to you "
                f"(uid {os.getuid()}); use another --state-dir"
            )
        if info.st_mode & 0o077:
            os.chmod(state_dir, 0o700)  # ours: keep others away from the control socket
        with tempfile.TemporaryFile(dir=state_dir):
            pass
    except FileExistsError:
        raise StartupError(
            f"state directory {state_dir} exists but is not a directory; move it away or use another --state-dir"
        ) from None
    except OSError as err:
        raise StartupError(
            f"state directory {state_dir} is not usable ({err.strerror or err}); "
            "fix its permissions, or use another --state-dir"
        ) from None
    return state_dir


def write_state(state_dir: Path, data: dict[str, Any]) -> None:
    """Write `data` as JSON to `<state_dir>/state.json` atomically (tmp file + os.replace)."""
    write_json_atomic(state_path(state_dir), data)


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """The last state the daemon wrote, or None when there is none (or it is unreadable)."""
    try:
        text = state_path(state_dir).read_text(encoding="utf-8")
    except OSError:  # missing, not a file, not readable
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


class AlreadyRunning(RuntimeError):
    """Another daemon holds the lock on this state directory (`holder`: the pid its lock file names,
    if it names one), or still runs with it after its lock file was removed."""

    def __init__(self, message: str, holder: str | None = None) -> None:
        super().__init__(message)
        self.holder = holder


def lock_path(state_dir: Path) -> Path:
    return Path(state_dir) / LOCK_FILE


def acquire_lock(state_dir: Path) -> IO[str]:
    """Take the state directory's exclusive lock for this process's lifetime.

    Returns the open lock file (keep it referenced). Raises AlreadyRunning naming the holder.
    """
    path = lock_path(state_dir)
    try:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the daemon's life
    except OSError as err:
        raise StartupError(
            f"cannot open the lock file {path}: {err.strerror or err}; "
            "fix the state directory's permissions, or use another --state-dir"
        ) from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(32).strip() or None  # a pid: bounded, whatever the file holds
        handle.close()
        if holder is None:  # written on a full disk: the lock is held all the same
            raise AlreadyRunning(
                f"another veloxd daemon is running with state dir {state_dir} "
                f"(unknown pid: its lock file {path} records none)"
            ) from None
        raise AlreadyRunning(
            f"another veloxd daemon (pid {holder}) is running with state dir {state_dir}", holder
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    except OSError:
        # A full disk: the lock is held all the same. The pid only names the holder to a second
        # daemon (which says the pid is unknown without it); the state writer reports the disk itself.
        pass
    return handle


def live_daemon_pid(state: dict[str, Any] | None) -> int | None:
    """The pid of the daemon `state` records (`state["daemon"]`) while that very process still runs
    (same pid and start time: a reused pid is somebody else), else None. Never this process, nor
    one whose last word was `running: false` (stopped: it only has to exit, its lock already freed)."""
    daemon = (state or {}).get("daemon")
    if not isinstance(daemon, dict) or daemon.get("running") is False:
        return None
    pid, start_time = daemon.get("pid"), daemon.get("start_time")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or pid == os.getpid():
        return None
    return pid if isinstance(start_time, str) and is_same_process(pid, start_time) else None
