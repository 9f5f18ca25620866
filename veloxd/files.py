"""Atomic file writes (a temporary file, fsync, rename): a crash never leaves half a file behind.

The one writer of the state file, the admission measurements and the service files.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    if not path.parent.exists():  # a parent that is a file fails below, as NotADirectoryError
        path.parent.mkdir(parents=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    """`data` as indented JSON (non-JSON values as their str) and a final newline."""
    write_atomic(path, (json.dumps(data, indent=2, default=str) + "\n").encode(), mode)


def read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
