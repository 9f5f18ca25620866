"""File watching: the config's directory and local model directories. Callbacks only enqueue.

Watch the config's *directory*, not the file: editors save by renaming a new file over the
old one (vim, atomic os.replace), which a watch on the old inode never sees. The pure
helpers here (Debounce, fingerprints) are used by the loop thread to decide what to do.
"""

from __future__ import annotations

import contextlib
import os
import queue
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from veloxd.daemon import messages as m

# "opened" and "closed_no_write" fire when anyone merely reads a file (we do, and so does a
# worker loading its weights); only these kinds can change content.
CHANGE_EVENTS = frozenset({"created", "modified", "moved", "deleted", "closed"})


class Debounce:
    """Fires once events have been quiet for `quiet_s`, or `max_wait_s` after the first one."""

    def __init__(self, quiet_s: float, max_wait_s: float) -> None:
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self._first: float | None = None
        self._last = 0.0

    def poke(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._last = now

    @property
    def pending(self) -> bool:
        return self._first is not None

    def deadline(self) -> float | None:
        if self._first is None:
            return None
        return min(self._last + self.quiet_s, self._first + self.max_wait_s)

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def clear(self) -> None:
        self._first = None


def stat_signature(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime_ns) of `path`, or None if it is missing: a cheap 'did it change'."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def model_fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime_ns) of each visible file in a model directory, sorted."""
    entries = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                entries.append((entry.name, st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(entries))


def local_model_dir(model: str, base: Path | None = None) -> Path | None:
    """The directory of a local-path model (mlx_lm treats an existing path as local), else None."""
    path = Path(model).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path.resolve() if path.is_dir() else None


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in CHANGE_EVENTS or event.is_directory:
            return
        paths = [os.fsdecode(event.src_path)]
        if getattr(event, "dest_path", ""):
            paths.append(os.fsdecode(event.dest_path))
        self._watcher.route(paths)


class Watcher:
    """One watchdog observer over the config's directory and the local model directories."""

    def __init__(self, config_path: Path, inbox: queue.SimpleQueue[Any]) -> None:
        # Real directory path: FSEvents reports /private/tmp/... for /tmp/..., for instance. A config
        # that is itself a symlink is followed by the loop's stat poll instead.
        config_path = Path(os.path.abspath(config_path))
        self.config_path = Path(os.path.realpath(config_path.parent)) / config_path.name
        self._inbox = inbox
        self._observer = Observer()
        self._observer.daemon = True
        self._handler = _Handler(self)
        self._watches: dict[Path, Any] = {}
        self._model_dirs: frozenset[Path] = frozenset()

    def start(self) -> None:
        self._observer.start()
        self.ensure_config_watch()

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)

    def ensure_config_watch(self) -> bool:
        """Watch the config's directory; False while it does not exist (retried by the loop)."""
        return self._watch(self.config_path.parent)

    def set_model_dirs(self, directories: frozenset[Path]) -> None:
        """Watch exactly these model directories (plus the config's directory)."""
        for gone in self._model_dirs - directories:
            if gone != self.config_path.parent:
                self._unwatch(gone)
        self._model_dirs = directories
        for directory in directories:
            self._watch(directory)

    def route(self, paths: list[str]) -> None:
        """Observer thread: turn event paths into loop messages."""
        config = str(self.config_path)
        for path in paths:
            if path == config:
                self._inbox.put(m.ConfigTouched())
            parent = Path(path).parent
            if parent in self._model_dirs:
                self._inbox.put(m.ModelTouched(str(parent)))

    def _watch(self, directory: Path) -> bool:
        if directory in self._watches:
            return True
        try:
            self._watches[directory] = self._observer.schedule(self._handler, str(directory), recursive=False)
        except OSError:
            return False
        return True

    def _unwatch(self, directory: Path) -> None:
        watch = self._watches.pop(directory, None)
        if watch is not None:
            with contextlib.suppress(KeyError, OSError):
                self._observer.unschedule(watch)
