"""Say in one line why a path cannot be read, written or made a directory, naming the component at fault.

An OSError's own text names only the path it was given ("Not a directory: .../LaunchAgents/x.plist"),
while the culprit is usually an ancestor: a file, or a symlink to nowhere, where a directory should be.
"""

from __future__ import annotations

from pathlib import Path


def _what(path: Path) -> str:
    return "a broken symlink" if path.is_symlink() and not path.exists() else "not a directory"


def blocking_parent(path: Path) -> Path | None:
    """The topmost ancestor of `path` that stands where a directory must be (a file, a broken symlink);
    None when every ancestor is a directory or does not exist yet (mkdir makes those)."""
    for parent in reversed(path.parents):  # from / down to path.parent
        if parent.is_dir():
            continue
        return parent if parent.exists() or parent.is_symlink() else None
    return None


def dir_problem(path: Path) -> str | None:
    """Why `path` cannot be (or be made) a directory, or None when it is one or mkdir can make it."""
    if path.is_dir():
        return None
    if path.exists() or path.is_symlink():
        return f"{path} is {_what(path)}"
    blocker = blocking_parent(path)
    return f"{blocker} is {_what(blocker)}" if blocker is not None else None


def os_problem(err: OSError, path: Path) -> str:
    """`err` (raised on `path`) in a few words: the ancestor in the way when there is one, else its strerror."""
    blocker = blocking_parent(path)
    if blocker is not None:
        return f"{blocker} is {_what(blocker)}"
    return err.strerror or str(err)
