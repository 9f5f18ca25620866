"""Logging setup: structlog JSON, one object per line, to a size-rotated file and a terminal.

Standard-library loggers (watchdog's, for instance) go through the same renderer, so every
line of the log has `timestamp` (ISO-8601 UTC), `level`, `event` and `logger`.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path
from typing import Any

import structlog

FIXED_KEYS = ("timestamp", "level", "event", "logger")
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
        structlog.processors.dict_tracebacks,
    ]


def configure_logging(
    log_file: Path | None,
    *,
    to_stdout: bool | None = None,
    max_bytes: int = MAX_BYTES,
    backups: int = BACKUPS,
    level: int = logging.INFO,
) -> None:
    """Send structlog and stdlib logging to `log_file` (rotated) and, on a TTY, to stdout.

    Args:
        log_file: JSON-lines file; its directory is created. None: no file.
        to_stdout: also write to stdout; default: only when stdout is a terminal.
    """
    if to_stdout is None:
        to_stdout = sys.stdout.isatty()
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(sort_keys=False, default=str),
        ],
    )
    handlers: list[logging.Handler] = []
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(
            logging.handlers.RotatingFileHandler(
                log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
            )
        )
    if to_stdout:
        handlers.append(logging.StreamHandler(sys.stdout))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
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
