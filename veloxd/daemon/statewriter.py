"""The daemon's state file, written when a fact in it changed; a failed write is an event, not a crash.

A fact changed when the daemon's change count moved (`Changes.bump`) or the log handler's own
facts did (a size rotation, lost records). The servers do not depend on the file, so a failed
write is logged once per distinct error, shown by `veloxd status` through the control socket
(`error`), and retried at every loop wakeup until one succeeds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from veloxd.daemon.logs import log_file_id, log_write_status
from veloxd.daemon.statefile import Changes, write_state

LogFacts = tuple[Any, Any]  # (log file id, log write status)


def log_facts() -> LogFacts:
    """What the log handler changes on its own: read each loop pass, cheaply."""
    return log_file_id(), log_write_status()


class StateWriter:
    """Owned by the daemon's loop thread, like the facts it writes."""

    def __init__(self, state_dir: Path, changes: Changes, log: Any) -> None:
        self.state_dir, self.changes, self.log = state_dir, changes, log
        self.error: str | None = None  # the last write's error, until a write succeeds
        self._written: tuple[int, LogFacts] | None = None  # (changes.count, log facts) last on disk

    def write(self, build: Callable[[LogFacts], dict[str, Any]]) -> None:
        """Write `build(log facts)` if a fact changed since the last successful write (or it failed)."""
        seen = (self.changes.count, log_facts())
        if seen == self._written and self.error is None:
            return
        try:
            write_state(self.state_dir, build(seen[1]))
        except OSError as err:
            error = f"{type(err).__name__}: {err.strerror or err}"
            if error != self.error:  # once per distinct error, not once per retry
                self.log.error("state_write_failed", state_dir=str(self.state_dir), error=error, errno=err.errno)
            self.error = error
            return
        if self.error is not None:
            self.log.info("state_write_recovered", state_dir=str(self.state_dir), previous_error=self.error)
            self.error = None
            self.changes.bump()  # the file just written still names the error: write it again without
        self._written = seen
