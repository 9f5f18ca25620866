"""The daemon's JSON log file: size rotation, reopening when the path names another file, and an
honest account of records that could not be written.

The file survives rotation by others (logrotate, newsyslog, a user deleting it): before each
write the handler compares the path's device and inode with the open file's, as the stdlib's
WatchedFileHandler does, and reopens the path when they differ; SIGHUP reopens it too.

A record that cannot be written (a full disk: ENOSPC; a removed, read-only or replaced log
directory: ENOENT, EACCES, EROFS, ENOTDIR) is counted, never printed as Python's `--- Logging
error ---` on stderr. When writing works again, the first record in the file is
`log_write_recovered` with how many records were lost and since when, as the state file does
with `state_write_failed` / `state_write_recovered` (veloxd/daemon/statewriter.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import logging.handlers
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def error_text(err: BaseException) -> str:
    """`FileExistsError: File exists: /var/log/veloxd` rather than the errno-prefixed repr."""
    strerror, filename = getattr(err, "strerror", None), getattr(err, "filename", None)
    return f"{type(err).__name__}: {strerror or err}" + (f": {filename}" if strerror and filename else "")


@dataclass
class WriteFailure:
    """One spell of failed writes: from the first lost record until a write works again."""

    since: str  # wall clock of the first lost record (ISO-8601 UTC)
    error: str  # the latest error
    errno: int | None
    lost: int = 0


class ReopeningFileHandler(logging.handlers.RotatingFileHandler):
    """Size rotation of our own, plus WatchedFileHandler's reopen when the path names another file,
    plus counting (not printing) the records it could not write.

    One stat per record: cheap next to the JSON rendering. Reopening recreates a deleted
    directory too, so a cleaned-up log folder does not silence the daemon.
    """

    def __init__(self, filename: Path, max_bytes: int, backups: int) -> None:
        self._ident: tuple[int, int] | None = None  # before super().__init__, which opens the file
        self.failure: WriteFailure | None = None  # while records are being lost
        self.lost_total = 0  # every record lost since the daemon started (the metric)
        self._announced: str | None = None  # the failure's error the daemon has logged (take_write_failure)
        self._announcing = False  # writing an announcement (_announce): its own failure is not a lost record
        super().__init__(filename, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        stream = super()._open()
        info = os.fstat(stream.fileno())
        self._ident = (info.st_dev, info.st_ino)
        if self.failure is not None and info.st_size:
            _drop_partial_record(stream)  # a record cut off by a full disk must not swallow the next one
        return stream

    def emit(self, record: logging.LogRecord) -> None:
        if self._announcing:  # an announcement itself: a failure propagates to its caller
            self._write(record)
            return
        try:
            self._follow_path()
            if self.failure is not None:
                self._announce_recovery()
            self._write(record)
        except Exception as err:  # every lost record is counted, whatever lost it
            self._lose(err)

    def handleError(self, record: logging.LogRecord) -> None:
        """Counted, never Python's `--- Logging error ---` traceback on stderr."""
        err = sys.exc_info()[1]
        self._lose(err if err is not None else OSError("unknown logging error"))

    def _follow_path(self) -> None:
        try:
            info = os.stat(self.baseFilename)
            moved = (info.st_dev, info.st_ino) != self._ident
        except (FileNotFoundError, NotADirectoryError):  # deleted, or its directory replaced by a file
            moved = True
        except OSError:
            moved = False
        if moved and self.stream is not None:
            self.reopen()
            self._announce("info", "log_reopened", log_file=self.baseFilename, reason="moved_or_deleted")

    def _write(self, record: logging.LogRecord) -> None:
        """FileHandler.emit without its catch-all: an OSError reaches the caller."""
        if self.stream is None:
            self.stream = self._open()
        if self.shouldRollover(record):
            self.doRollover()
            if self.stream is None:
                self.stream = self._open()
        self.stream.write(self.format(record) + self.terminator)
        self.stream.flush()

    def _announce_recovery(self) -> None:
        """Writing works again (or so it seems): log_write_recovered goes first, to every handler."""
        if self.stream is None:
            self.stream = self._open()  # raises while the path still cannot be opened
        failure = self.failure
        assert failure is not None
        if failure.errno == errno.ENOSPC and not _space_left(self.stream.fileno()):
            # The last block's slack may still take a short record: not a recovery, and no flapping.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._announce(
            "warning",
            "log_write_recovered",
            log_file=self.baseFilename,
            lost_records=failure.lost,
            failed_since=failure.since,
            error=failure.error,
            errno=failure.errno,
        )
        self.failure = None
        self._announced = None

    def _announce(self, level: str, event: str, **keys: Any) -> None:
        """Log `event` to every handler before the record being emitted, so it is the first line of
        a reopened file (the handler's lock is re-entrant; this handler writes it directly)."""
        self._announcing = True
        try:
            getattr(structlog.stdlib.get_logger("veloxd.daemon"), level)(event, **keys)
        finally:
            self._announcing = False

    def _lose(self, err: BaseException) -> None:
        if self.failure is None:
            self.failure = WriteFailure(since=_now(), error=error_text(err), errno=getattr(err, "errno", None))
        else:
            self.failure.error, self.failure.errno = error_text(err), getattr(err, "errno", None)
        self.failure.lost += 1
        self.lost_total += 1
        if isinstance(err, OSError):
            self._discard_stream()  # opened again for the next record: a new disk, a new directory

    def _discard_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(OSError):  # the descriptor is closed even if flushing a full buffer fails
                stream.close()

    def reopen(self) -> None:
        """Close the stream and open the path again (created if missing)."""
        self.acquire()
        try:
            self._discard_stream()
            self.stream = self._open()
        except OSError:
            self.stream = None  # opened lazily on the next record; a failure there is counted
        finally:
            self.release()

    def write_status(self) -> dict[str, Any]:
        """What the daemon publishes: records lost in total, and the current spell of failures if any."""
        self.acquire()
        try:
            failure = self.failure
            return {
                "log_file": self.baseFilename,
                "lost_records_total": self.lost_total,
                "failing": failure is not None,
                "failed_since": failure.since if failure is not None else None,
                "lost_records": failure.lost if failure is not None else 0,
                "error": failure.error if failure is not None else None,
                "errno": failure.errno if failure is not None else None,
            }
        finally:
            self.release()

    def take_failure(self) -> dict[str, Any] | None:
        """The current failure once per distinct error (for the daemon's `log_write_failed` event)."""
        self.acquire()
        try:
            failure = self.failure
            if failure is None or failure.error == self._announced:
                return None
            self._announced = failure.error
            return {
                "log_file": self.baseFilename,
                "failed_since": failure.since,
                "error": failure.error,
                "errno": failure.errno,
            }
        finally:
            self.release()

    @property
    def ident(self) -> tuple[int, int] | None:
        return self._ident


def _space_left(fd: int) -> bool:
    """Whether the file system holding `fd` has a free block for this process (root may use the reserve)."""
    try:
        info = os.fstatvfs(fd)
    except OSError:
        return True  # cannot tell: try the write
    return (info.f_bfree if os.geteuid() == 0 else info.f_bavail) > 0


def _drop_partial_record(stream: Any) -> None:
    """Cut the file after its last newline: what a failed write left of a record (already counted as
    lost) would otherwise run into the next record. No newline in the last 64 KiB: one is added."""
    try:
        with open(stream.name, "rb") as reader:  # the stream itself is write-only
            size = os.fstat(reader.fileno()).st_size
            start = max(0, size - 65536)
            tail = os.pread(reader.fileno(), size - start, start)
        if tail.endswith(b"\n"):
            return
        cut = tail.rfind(b"\n")
        if cut < 0 and start > 0:
            stream.write("\n")
            return
        os.ftruncate(stream.fileno(), start + cut + 1)
    except OSError:
        return  # the next record may run on from the partial one; it is still written
