"""Local model directories: which servers load from each, and whether its weights changed.

mlx_lm keys its prompt cache on the model path, so new weights at the same path must restart
the servers using it. Owned by the loop thread; the watcher only reports "something changed".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from veloxd.daemon.watch import Debounce, local_model_dir, model_fingerprint

QUIET_S = 1.0  # weights are big: act once a copy has been quiet for a second
MAX_WAIT_S = 30.0


class ModelDirs:
    """Fingerprints of the watched model directories and a debounce per directory."""

    def __init__(self) -> None:
        self.servers: dict[str, list[str]] = {}  # directory -> server names
        self._prints: dict[str, tuple[Any, ...]] = {}
        self._debounce: dict[str, Debounce] = {}

    def update(self, entries: Mapping[str, Any]) -> frozenset[Path]:
        """Follow the local models of these entries; returns the directories to watch."""
        servers: dict[str, list[str]] = {}
        for name, entry in entries.items():
            model_dir = local_model_dir(entry.model)
            if model_dir is not None:
                servers.setdefault(str(model_dir), []).append(name)
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

    def changed(self, now: float) -> list[tuple[str, list[str]]]:
        """(directory, servers) for each directory whose files differ once its events went quiet."""
        out = []
        for directory, debounce in self._debounce.items():
            if not debounce.due(now):
                continue
            debounce.clear()
            fingerprint = model_fingerprint(Path(directory))
            if fingerprint != self._prints.get(directory):
                self._prints[directory] = fingerprint
                out.append((directory, list(self.servers.get(directory, []))))
        return out
