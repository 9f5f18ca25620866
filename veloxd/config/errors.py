"""Config problems as data: `ConfigIssue` (FILE:LINE:COL: message (at $.path)) and `ConfigError`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

PathParts = tuple[Any, ...]  # ("servers", "coder", "overrides", "kivi_group_size") or list indices

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def json_path(parts: Iterable[Any]) -> str:
    """`("servers", "coder", 0)` -> `$.servers.coder[0]`; odd keys are bracket-quoted."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            out += f".{part}"
        else:
            out += "['" + str(part).replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


@dataclass(frozen=True, order=True)
class ConfigIssue:
    """One problem in a config file, located by 1-based line and column and by JSON path."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message} (at {self.path})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ConfigError(Exception):
    """All the problems found in one config file; `unreadable` when the file could not be read."""

    def __init__(self, issues: list[ConfigIssue], unreadable: bool = False) -> None:
        self.issues = sorted(set(issues), key=lambda i: (i.line, i.column, i.path, i.message))
        self.unreadable = unreadable
        super().__init__("\n".join(str(i) for i in self.issues))


def one_line(text: str, limit: int = 1000) -> str:
    """Collapse whitespace and cap the length (generous: a message names paths, which may be long)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def short_repr(value: Any, limit: int = 60) -> str:
    """repr() for messages, never longer than about `limit`: a huge value must not become a huge message."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} characters)"
    if isinstance(value, (list, dict)) and len(value) > 8:
        return f"a {'list' if isinstance(value, list) else 'mapping'} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
