"""Reading the config for a reload: same bytes as the config applied -> nothing to do; invalid -> errors.

The whole new file is validated before anything is applied; the caller keeps the last good
config when this returns `Invalid`. Only an *accepted* file is remembered by hash: a refusal
is never cached, because it can depend on more than the bytes (the file's mode or owner, its
existence), and a fixed world must be seen on the next reload, SIGHUP or watch event.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veloxd.config import ConfigError, load_config


@dataclass(frozen=True)
class Invalid:
    sha256: str | None
    errors: list[dict[str, Any]]  # file, line, column, path, message
    lines: list[str]  # the same, as FILE:LINE:COL: message (at $.path)


@dataclass(frozen=True)
class Unchanged:
    sha256: str | None


@dataclass(frozen=True)
class Valid:
    config: Any  # veloxd.config.Config


Outcome = Unchanged | Invalid | Valid


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


class ConfigSource:
    """The config file, and the hash of the last bytes accepted."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.accepted_sha256: str | None = None  # None also after a refusal: the next read loads

    def read(self) -> Outcome:
        """Load the file unless its bytes are those of the config applied by the last read."""
        sha = file_sha256(self.path)
        if sha is not None and sha == self.accepted_sha256:
            return Unchanged(sha)
        outcome = self._load(sha)
        self.accepted_sha256 = outcome.config.sha256 if isinstance(outcome, Valid) else None
        return outcome

    def _load(self, sha: str | None) -> Invalid | Valid:
        if sha is None and not self.path.exists():
            message = "config file not found"
            return Invalid(None, [_issue(self.path, message)], [f"{self.path}: {message}"])
        try:
            return Valid(load_config(self.path))
        except ConfigError as err:
            issues = err.issues or []
            return Invalid(sha, [i.to_dict() for i in issues], [str(i) for i in issues] or [str(err)])
        except OSError as err:
            message = f"cannot read the config: {err.strerror or err}"
            return Invalid(sha, [_issue(self.path, message)], [f"{self.path}: {message}"])


def _issue(path: Path, message: str) -> dict[str, Any]:
    return {"file": str(path), "line": None, "column": None, "path": "$", "message": message}
