"""The state directory stays the running daemon's, even when it is removed from under it.

Its lock file `daemon.lock` is what keeps a second daemon out. Should it (or the whole directory)
be removed while the daemon runs, a second daemon would take a fresh lock and then treat the first
one's workers as orphans. Two defences:
- `refuse_live_daemon`: a daemon that just took the lock still refuses to start while the daemon
  its state file records is that very process, or while a daemon listens on its control socket;
- `StateDirGuard.check`, on the daemon's regular poll tick: the directory, the lock file (the
  held descriptor's inode against the path's) and the control socket are made again when they
  vanished or were replaced, and the state file is written again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from veloxd.daemon.control import ControlServer, answering, socket_path_of
from veloxd.daemon.statefile import (
    AlreadyRunning,
    Changes,
    StartupError,
    acquire_lock,
    ensure_state_dir,
    live_daemon_pid,
    lock_path,
    read_state,
    state_path,
)


def refuse_live_daemon(state_dir: Path) -> None:
    """For a daemon that has just taken the lock of `state_dir`: AlreadyRunning when another daemon
    runs with that directory all the same (its lock file was removed or replaced, so the lock
    proved nothing): the one the state file records is still that process, or a daemon listens on
    the control socket."""
    pid = live_daemon_pid(read_state(state_dir))
    if pid is None:
        path = socket_path_of(state_dir)
        live, pid = answering(path) if path is not None else (False, None)
        if not live:
            return
    who = f"another veloxd daemon (pid {pid})" if pid is not None else "another veloxd daemon (its pid is not known)"
    raise AlreadyRunning(
        f"{who} is running with state dir {state_dir}, but its lock file {lock_path(state_dir)} was removed; "
        "it takes it again within seconds: stop that daemon first, or use another --state-dir",
        str(pid) if pid is not None else None,
    )


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


class StateDirGuard:
    """Owned by the daemon's loop thread; `check` runs on its poll tick. Every failure is logged once
    per distinct error (it is retried on every tick) and stops nothing: the servers keep running."""

    def __init__(
        self, state_dir: Path, lock: IO[str] | None, control: ControlServer, changes: Changes, log: Any
    ) -> None:
        self.state_dir = Path(state_dir)
        self.lock = lock  # the held lock file (None: nothing to keep)
        self._control, self._changes, self._log = control, changes, log
        self._dir = _identity(self.state_dir.stat())  # made and checked by ensure_state_dir just before
        self._failing: dict[str, str] = {}  # event -> the error last logged for it

    def check(self) -> None:
        if not self._keep_dir():
            return
        self._keep_lock()
        self._keep_socket()
        if not state_path(self.state_dir).exists():
            self._changes.bump()  # written again on this loop pass: status and the next daemon read it

    def _keep_dir(self) -> bool:
        try:
            found = _identity(self.state_dir.stat())
        except FileNotFoundError:
            found = None
        except OSError as err:
            return self._failed("state_dir_check_failed", err.strerror or str(err))
        if found == self._dir:
            return True
        try:
            ensure_state_dir(self.state_dir)  # 0700, ours, writable
            self._dir = _identity(self.state_dir.stat())
        except (StartupError, OSError) as err:
            return self._failed("state_dir_recreate_failed", str(err))
        self._failing.pop("state_dir_recreate_failed", None)
        # Not told apart: missing, or another directory in its place (the state writer's own, made
        # with the umask's mode when it wrote first): either way it is now ours and 0700 again.
        self._log.warning("state_dir_recreated", state_dir=str(self.state_dir), mode="0700")
        return True

    def _keep_lock(self) -> None:
        if self.lock is None:
            return
        path = lock_path(self.state_dir)
        try:
            found = _identity(path.stat())
        except FileNotFoundError:
            found = None
        except OSError as err:
            self._failed("lock_file_check_failed", err.strerror or str(err))
            return
        if found == _identity(os.fstat(self.lock.fileno())):
            return
        try:
            handle = acquire_lock(self.state_dir)
        except AlreadyRunning as err:  # somebody else got it meanwhile (a second daemon): keep serving
            self._failed("lock_lost", str(err), lock_file=str(path), holder=err.holder)
            return
        except StartupError as err:
            self._failed("lock_file_recreate_failed", str(err))
            return
        old, self.lock = self.lock, handle
        old.close()
        for event in ("lock_lost", "lock_file_recreate_failed"):
            self._failing.pop(event, None)
        reason = "missing" if found is None else "replaced"
        self._log.warning("lock_file_recreated", lock_file=str(path), reason=reason, pid=os.getpid())

    def _keep_socket(self) -> None:
        try:
            rebound = self._control.rebind()
        except StartupError as err:
            self._failed("control_socket_rebind_failed", str(err))
            return
        if rebound:
            self._failing.pop("control_socket_rebind_failed", None)
            self._log.warning("control_socket_rebound", control_socket=str(self._control.path))

    def _failed(self, event: str, error: str, **keys: Any) -> bool:
        """Log `event` at error level unless this very error was the last one logged for it; False."""
        if self._failing.get(event) != error:
            self._failing[event] = error
            self._log.error(event, state_dir=str(self.state_dir), error=error, **keys)
        return False
