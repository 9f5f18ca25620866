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
        self._pokes = 0

    def poke(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._last = now
        self._pokes += 1

    def deadline(self) -> float | None:
        if self._first is None:
            return None
        return min(self._last + self.quiet_s, self._first + self.max_wait_s)

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def clear(self) -> int:
        """Start over; returns how many pokes this round merged (a burst of edits: one reload)."""
        pokes, self._first, self._pokes = self._pokes, None, 0
        return pokes


def stat_signature(path: Path) -> tuple[int, ...] | None:
    """(inode, size, mtime_ns, mode, uid) of `path`, or None if it is missing: a cheap 'did it change'.

    Mode and owner count: a refused file (writable by others) is fixed by a chmod that leaves
    its bytes and mtime alone.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)


def model_fingerprint(directory: Path) -> tuple[Any, ...]:
    """What a model path holds now: the directory's own inode, then (name, size, mtime_ns) of each
    visible file, sorted; () when nothing is there. A directory renamed into place has a new inode
    even when a copy kept every name, size and mtime."""
    entries = []
    try:
        inode = os.stat(directory).st_ino
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
    return (inode, *sorted(entries))


def watch_path(path: Path) -> Path:
    """`path` with its parent's symlinks resolved (FSEvents reports /private/tmp/... for /tmp/...),
    the path itself kept: it may not exist yet, or be replaced."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def link_chain(path: Path, limit: int = 40) -> list[Path]:
    """The symlinks `path` goes through to reach what it names, itself first ([] when it is none).

    A model path may be a link to a link (`current -> v -> v1`): swapping the inner one changes
    what the path names without an event in the path's own directory, so each link's directory
    is watched too.
    """
    links: list[Path] = []
    current = Path(os.path.abspath(path))
    for _ in range(limit):  # the kernel's own limit on links followed (ELOOP beyond)
        try:
            target = os.readlink(current)
        except OSError:
            break
        links.append(current)
        current = Path(os.path.abspath(current.parent / target))
    return links


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in CHANGE_EVENTS:
            return
        paths = [os.fsdecode(event.src_path)]
        if getattr(event, "dest_path", ""):
            paths.append(os.fsdecode(event.dest_path))
        self._watcher.route(paths)


class Watcher:
    """One watchdog observer over the config's directory and the local model paths.

    Each model path is watched twice: the directory itself (files written in place) and its
    parent (the directory created, renamed into place, moved away or deleted). A watch follows
    an inode, so `sync_models` re-aims it when the path names another directory than before.
    """

    def __init__(self, config_path: Path, inbox: queue.SimpleQueue[Any]) -> None:
        # Real directory path: FSEvents reports /private/tmp/... for /tmp/..., for instance. A config
        # that is itself a symlink is followed by the loop's stat poll instead.
        self.config_path = watch_path(config_path)
        self._inbox = inbox
        self._observer = Observer()
        self._observer.daemon = True
        self._handler = _Handler(self)
        self._watches: dict[Path, tuple[Any, int]] = {}  # directory -> (watch, inode watched)
        self._model_dirs: frozenset[Path] = frozenset()
        self._links: dict[Path, Path] = {}  # an inner symlink of a model path -> that model path

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
        """Follow exactly these model paths (plus the config's directory)."""
        self._model_dirs = directories
        self.sync_models()

    def sync_models(self) -> None:
        """Watch each model path and its parent as they are now (the loop calls this on its poll)."""
        wanted = {self.config_path.parent}
        links: dict[Path, Path] = {}
        for path in self._model_dirs:
            wanted |= {path, path.parent}
            for link in link_chain(path)[1:]:  # the path itself is seen through its parent's watch
                links[watch_path(link)] = path
                wanted.add(watch_path(link).parent)
        self._links = links  # one assignment: the observer thread reads it
        for directory in set(self._watches) - wanted:
            self._unwatch(directory)
        for directory in wanted:
            self._watch(directory)

    def route(self, paths: list[str]) -> None:
        """Observer thread: turn event paths into loop messages."""
        config = str(self.config_path)
        for path in paths:
            if path == config:
                self._inbox.put(m.ConfigTouched())
            for candidate in (Path(path), Path(path).parent):
                if candidate in self._model_dirs:
                    self._inbox.put(m.ModelTouched(str(candidate)))
            linked = self._links.get(Path(path))
            if linked is not None:
                self._inbox.put(m.ModelTouched(str(linked)))

    def _watch(self, directory: Path) -> bool:
        try:
            inode = os.stat(directory).st_ino
        except OSError:
            self._unwatch(directory)
            return False
        known = self._watches.get(directory)
        if known is not None and known[1] == inode:
            return True
        self._unwatch(directory)  # the path names another directory now: re-aim the watch
        if known is not None and directory in self._model_dirs:
            # Seen by the poll, not by an event (a link swapped where no watch looks): say so.
            self._inbox.put(m.ModelTouched(str(directory)))
        try:
            self._watches[directory] = (self._observer.schedule(self._handler, str(directory), recursive=False), inode)
        except OSError:
            return False
        return True

    def _unwatch(self, directory: Path) -> None:
        known = self._watches.pop(directory, None)
        if known is not None:
            with contextlib.suppress(KeyError, OSError):
                self._observer.unschedule(known[0])
