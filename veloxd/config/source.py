"""Read a config file defensively: a regular file, at most 1 MiB, UTF-8, not writable by other users."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_BYTES = 1 << 20

Position = tuple[int, int]


class SourceProblem(Exception):
    """The file cannot be used at all; `unreadable` when it could not even be read."""

    def __init__(self, message: str, *, unreadable: bool, position: Position = (1, 1)) -> None:
        super().__init__(message)
        self.message, self.unreadable, self.position = message, unreadable, position


@dataclass
class Source:
    path: Path  # absolute, symlinks kept (relative model paths resolve against its directory)
    text: str
    sha256: str
    problems: list[tuple[Position, str]] = field(default_factory=list)  # refusals that do not stop parsing


def read_source(path: str | os.PathLike) -> Source:
    """Read and decode `path`; SourceProblem when that is impossible."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SourceProblem("no such file", unreadable=True) from None
    except OSError as err:
        raise SourceProblem(f"cannot read: {err.strerror or err}", unreadable=True) from None
    if stat.S_ISDIR(info.st_mode):
        raise SourceProblem("is a directory, not a config file", unreadable=True)
    if not stat.S_ISREG(info.st_mode):
        raise SourceProblem("is not a regular file", unreadable=True)
    if info.st_size > MAX_BYTES:
        raise SourceProblem(f"file is {info.st_size} bytes; the limit is {MAX_BYTES} (1 MiB)", unreadable=False)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as err:
        raise SourceProblem(f"cannot read: {err.strerror or err}", unreadable=True) from None
    if len(data) > MAX_BYTES:  # grew after stat
        raise SourceProblem(f"file is over the limit of {MAX_BYTES} bytes (1 MiB)", unreadable=False)
    return Source(
        path=path, text=_decode(data), sha256=hashlib.sha256(data).hexdigest(), problems=_ownership_problems(path, info)
    )


def _decode(data: bytes) -> str:
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = body.rfind(b"\n", 0, err.start) + 1
        line = body.count(b"\n", 0, err.start) + 1
        column = len(body[line_start : err.start].decode("utf-8", "replace")) + 1
        raise SourceProblem(
            f"not UTF-8: byte 0x{body[err.start]:02X} cannot be decoded; save the file as UTF-8",
            unreadable=False,
            position=(line, column),
        ) from None


def _ownership_problems(path: Path, info: os.stat_result) -> list[tuple[Position, str]]:
    """The file decides which programs the daemon runs: only its owner may change it."""
    problems = []
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = (
            "group and others"
            if info.st_mode & stat.S_IWGRP and info.st_mode & stat.S_IWOTH
            else ("its group" if info.st_mode & stat.S_IWGRP else "others")
        )
        problems.append(
            (
                (1, 1),
                f"refused: the file is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o}) "
                f"and decides what the daemon runs; run: chmod go-w '{path}'",
            )
        )
    if info.st_uid not in (os.getuid(), 0):
        problems.append(((1, 1), f"refused: the file belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"))
    try:
        parent = os.stat(path.resolve().parent)
    except OSError:
        return problems
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        problems.append(
            (
                (1, 1),
                f"refused: its directory {path.resolve().parent} is writable by others, who could replace the file",
            )
        )
    return problems
