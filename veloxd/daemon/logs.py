"""Logging setup: structlog JSON, one object per line, to a size-rotated file; readable lines on a terminal.

Standard-library loggers (watchdog's, for instance) go through the same processors, so every
line of the log has `timestamp` (ISO-8601 UTC), `level`, `event` and `logger`. The file is
always JSON; stdout gets `console` lines (veloxd/daemon/console.py) or the same JSON.
The file's handler (veloxd/daemon/logfile.py) follows rotation by others and counts the records
it could not write.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any, Literal, get_args

import structlog

from veloxd.daemon.console import ConsoleProcessor, use_colors
from veloxd.daemon.logfile import ReopeningFileHandler

FIXED_KEYS = ("timestamp", "level", "event", "logger")
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5
RECENT_EVENTS = 2000  # kept in memory for the dashboard's log tail
LogFormat = Literal["auto", "console", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)  # `veloxd run --log-format`'s choices


def _file_handlers() -> list[ReopeningFileHandler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, ReopeningFileHandler)]


def reopen_logs() -> list[str]:
    """Reopen every log file (SIGHUP); returns their paths."""
    handlers = _file_handlers()
    for handler in handlers:
        handler.reopen()
    return [h.baseFilename for h in handlers]


def log_file_id() -> list[int] | None:
    """[device, inode] of the log file being written, for `veloxd logs` to compare with the path."""
    for handler in _file_handlers():
        if handler.ident is not None:
            return list(handler.ident)
    return None


def log_write_status() -> dict[str, Any] | None:
    """Records the log file lost (in total, and in the current spell of failures), for the state file."""
    handlers = _file_handlers()
    return handlers[0].write_status() if handlers else None


def take_write_failure() -> dict[str, Any] | None:
    """A log file failure not yet reported (once per distinct error), for `log_write_failed`."""
    return next(filter(None, (h.take_failure() for h in _file_handlers())), None)


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]


def _json_formatter() -> logging.Formatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(sort_keys=False, default=str),
        ],
    )


def _console_formatter(colors: bool) -> logging.Formatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, ConsoleProcessor(colors)],
    )


def stdout_format(log_format: LogFormat, is_tty: bool) -> Literal["console", "json"] | None:
    """What stdout gets: `auto` is console lines on a terminal and nothing otherwise (the file has it all)."""
    if log_format == "auto":
        return "console" if is_tty else None
    return log_format


class RecentEvents(logging.Handler):
    """The last events as the log file has them, numbered, for the dashboard's live log tail.

    Read by the control socket's thread (`{"command": "events", "after": N}`) while any thread
    logs: its own lock guards the ring; nothing else of the daemon's state is touched.
    """

    def __init__(self, capacity: int = RECENT_EVENTS) -> None:
        super().__init__()
        self.setFormatter(_json_formatter())
        self._ring: deque[tuple[int, str]] = deque(maxlen=capacity)
        self._seq = 0
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a broken event must not take the daemon down; the file handler reports it
            return
        with self._guard:
            self._seq += 1
            self._ring.append((self._seq, line))

    def since(self, after: int = 0, limit: int = 500, server: str | None = None) -> dict[str, Any]:
        """Events numbered above `after` (optionally one server's), the newest `limit` of them."""
        with self._guard:
            items = [item for item in self._ring if item[0] > after]
            last = self._seq
        events = []
        for seq, line in items:
            record = json.loads(line)
            if server is None or record.get("server") == server:
                events.append({"seq": seq, **record})
        return {"events": events[-limit:] if limit > 0 else [], "last_seq": last}


RECENT = RecentEvents()


def configure_logging(
    log_file: Path | None,
    *,
    log_format: LogFormat = "auto",
    max_bytes: int = MAX_BYTES,
    backups: int = BACKUPS,
    level: int = logging.INFO,
) -> None:
    """Send structlog and stdlib logging to `log_file` (rotated JSON) and to stdout as `log_format` says.

    Args:
        log_file: JSON-lines file; its directory is created. None: no file.
        log_format: stdout's rendering: `console` (readable lines, colored on a terminal unless
            NO_COLOR is set), `json` (the file's lines), `auto` (console on a terminal, else nothing).
    """
    handlers: list[logging.Handler] = []
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = ReopeningFileHandler(log_file, max_bytes, backups)
        file_handler.setFormatter(_json_formatter())
        handlers.append(file_handler)
    shown = stdout_format(log_format, sys.stdout.isatty())
    if shown is not None:
        stream_handler = logging.StreamHandler(sys.stdout)
        stream_handler.setFormatter(
            _console_formatter(use_colors(sys.stdout)) if shown == "console" else _json_formatter()
        )
        handlers.append(stream_handler)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in [*handlers, RECENT]:
        root.addHandler(handler)
    root.setLevel(level)
    # watchdog logs every inotify detail at DEBUG; keep its warnings and errors only.
    logging.getLogger("watchdog").setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    """A structlog logger whose `logger` key is `name` (e.g. "veloxd.daemon")."""
    return structlog.stdlib.get_logger(name)
