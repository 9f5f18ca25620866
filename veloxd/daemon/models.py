"""Local model paths: which servers load from each, and whether what is there changed.

mlx_lm keys its prompt cache on the model path, so new weights at the same path must restart
the servers using it. Followed by *path*, not by inode: a directory replaced by a rename, or
restored after it went missing, is what the path now names (the watcher watches the parent).
Owned by the loop thread; the watcher only reports "something changed".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from veloxd.config.world import watched_paths
from veloxd.daemon.watch import Debounce, model_fingerprint, watch_path

QUIET_S = 1.0  # weights are big: act once a copy has been quiet for a second
MAX_WAIT_S = 30.0


def model_prints(entry: Any) -> tuple[tuple[Any, ...], ...]:
    """What each local path `entry` loads from (model, adapter) holds now, as ModelDirs compares it.

    A worker is spawned with these recorded, so a change reported later (after the debounce) that
    the worker already loaded (a waiting server's recheck started it once the path appeared)
    restarts nothing."""
    return tuple(model_fingerprint(watch_path(path)) for path in watched_paths(entry))


class ModelDirs:
    """Fingerprints of the watched model directories and a debounce per directory."""

    def __init__(self) -> None:
        self.servers: dict[str, list[str]] = {}  # directory -> server names
        self._prints: dict[str, tuple[Any, ...]] = {}
        self._debounce: dict[str, Debounce] = {}

    def update(self, entries: Mapping[str, Any]) -> frozenset[Path]:
        """Follow the local models (and adapters) of these entries; returns the paths to watch."""
        servers: dict[str, list[str]] = {}
        for name, entry in entries.items():
            for path in watched_paths(entry):
                servers.setdefault(str(watch_path(path)), []).append(name)
        for directory in servers.keys() - self._prints.keys():
            self._prints[directory] = model_fingerprint(Path(directory))
        for gone in self._prints.keys() - servers.keys():
            del self._prints[gone]
            self._debounce.pop(gone, None)
        self.servers = servers
        return frozenset(Path(d) for d in servers)

    def touched(self, directory: str, now: float) -> None:
        if directory in self.servers:
            self._debounce.setdefault(directory, Debounce(QUIET_S, MAX_WAIT_S)).poke(now)

    def deadline(self) -> float | None:
        return min((d for b in self._debounce.values() if (d := b.deadline()) is not None), default=None)

    def changed(self, now: float) -> list[tuple[str, list[str], bool]]:
        """(path, servers, present) for each path whose content differs once its events went quiet."""
        out = []
        for directory, debounce in self._debounce.items():
            if not debounce.due(now):
                continue
            debounce.clear()
            fingerprint = model_fingerprint(Path(directory))
            if fingerprint != self._prints.get(directory):
                self._prints[directory] = fingerprint
                out.append((directory, list(self.servers.get(directory, [])), bool(fingerprint)))
        return out
