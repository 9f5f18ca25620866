"""READY's memory figure, measured once per (model files, KV settings) and reused on later starts.

Measuring (veloxd.kv.footprint) runs probe prompts through the method's caches: seconds on a
small model, most of a start. Its result depends only on the model's files, the KV settings and
the code that builds the caches, so it is kept under `<state dir>/kv-figures/<key>.json`, the key
a hash of all of them (`figure_key`): a changed file (size or mtime), setting, or veloxd, mlx or
mlx_lm version re-measures. A figure read back is labelled `source: "cached"` (with
`measured_at`), one measured by this process `source: "measured"`.

The state directory is the daemon's (`protocol.STATE_DIR_ENV`), else the user cache directory
($XDG_CACHE_HOME/veloxd or ~/.cache/veloxd). Writes are atomic (a temporary file, then
os.replace); a directory that cannot be written, or a figure that cannot be read, is a logged
event and a fresh measurement, never a failed start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from veloxd import __version__, protocol

FIGURES_VERSION = 2  # bump when the figure's layout or the way it is measured changes
SUBDIR = "kv-figures"
MAX_FILES = 10_000  # a model directory is a handful of files; past this, no identity (always measure)
log = logging.getLogger("veloxd.serve.figures")

Measure = Callable[[Any, Any], dict[str, Any]]  # (model, KVCacheConfig) -> kv_memory figure


def state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where figures are kept: the daemon's state directory, else the user cache directory."""
    given = env.get(protocol.STATE_DIR_ENV)
    if given:
        return Path(given).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "veloxd"


def model_dir(model: str) -> Path | None:
    """The directory mlx_lm loads `model` from: a local directory, or a Hub id's local snapshot."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    from veloxd.download.cache import is_hub_model, local_snapshot

    return local_snapshot(model) if is_hub_model(model) else None


def files_identity(directory: Path) -> list[list[Any]] | None:
    """[relative path, size, mtime_ns] of every file under `directory` (links followed: a Hub
    snapshot links to its blobs); None when it cannot be listed or holds more than MAX_FILES."""
    found: list[list[Any]] = []
    try:
        for root, dirs, files in os.walk(directory, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in files:
                path = Path(root) / name
                stat = path.stat()
                found.append([str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns])
                if len(found) > MAX_FILES:
                    return None
    except OSError:
        return None
    return sorted(found)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def figure_key(model: str, kv: dict[str, Any], adapter_path: str | None = None) -> str | None:
    """The hash that names a figure: model files, adapter files, KV settings and code versions.
    None when the model's files cannot be identified (the figure is then measured every start)."""
    directory = model_dir(model)
    files = files_identity(directory) if directory is not None else None
    if files is None:
        return None
    adapter = None
    if adapter_path:
        adapter = files_identity(Path(adapter_path).expanduser().resolve())
        if adapter is None:
            return None
    document = {
        "figures_version": FIGURES_VERSION,
        "versions": {"veloxd": __version__, "mlx": _version("mlx"), "mlx_lm": _version("mlx-lm")},
        "model": str(directory),
        "files": files,
        "adapter": adapter,
        "kv": kv,
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32]


class FigureStore:
    """Figures by key under `<directory>/kv-figures/`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / SUBDIR

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.path(key)
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, NotADirectoryError):  # nothing kept (yet)
            return None
        except (OSError, ValueError) as err:
            log.warning("kv_figure_unreadable path=%s error=%s", path, err)
            return None
        figure = data.get("figure") if isinstance(data, dict) else None
        if not isinstance(figure, dict) or data.get("key") != key:
            log.warning("kv_figure_unreadable path=%s error=%s", path, "not a figure document of this key")
            return None
        return {**figure, "source": "cached", "measured_at": data.get("measured_at")}

    def save(self, key: str, figure: dict[str, Any]) -> bool:
        """Write atomically; False (logged) when the directory cannot be written."""
        document = {"key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "figure": figure}
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{key}.", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump(document, out, sort_keys=True)
            os.replace(tmp, self.path(key))
            return True
        except OSError as err:
            log.warning("kv_figure_unwritable path=%s error=%s", self.directory, err.strerror or err)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False


def reusing(store: FigureStore, key: str | None, measure: Measure) -> Measure:
    """`measure` behind the store: read back the figure of `key`, else measure and keep it."""

    def figure(model: Any, config: Any) -> dict[str, Any]:
        if key is not None:
            cached = store.load(key)
            if cached is not None:
                log.info("kv_figure_reused path=%s", store.path(key))
                return cached
        measured = {**measure(model, config), "source": "measured"}
        if key is not None and store.save(key, measured):
            log.info("kv_figure_saved path=%s", store.path(key))
        return measured

    return figure
