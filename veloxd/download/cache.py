"""Where Hugging Face models live on disk, and whether one is complete there. No third-party imports.

The daemon asks `local_snapshot` before starting an entry: a complete model skips the download
phase entirely. The layout is huggingface_hub's cache (`models--owner--name/refs/main`,
`snapshots/<commit>/`, `blobs/`, and the `trees/<commit>.json` listing that huggingface_hub
writes after a snapshot download); the directory follows the same variables it reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Final

from veloxd.checks import is_hf_id  # the one test of "a Hugging Face id" (the config's too)

# The files mlx_lm.utils fetches for a model (its DEFAULT_ALLOW_PATTERNS; a test keeps them equal).
ALLOW_PATTERNS: Final = (
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
)
TRUE_VALUES: Final = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's reading of boolean variables
REVISION: Final = "main"


def is_hub_model(model: str) -> bool:
    """True if `model` names a Hugging Face repository (mlx_lm: an existing path is local)."""
    return is_hf_id(model) and not Path(model).expanduser().exists()


def wanted(path: str) -> bool:
    """Whether mlx_lm loads this repository file (huggingface_hub's allow-pattern matching)."""
    return any(fnmatchcase(path, pattern) for pattern in ALLOW_PATTERNS)


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub."""
    env = os.environ if env is None else env
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(os.path.expandvars(os.path.expanduser(env[name])))
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def offline(env: Mapping[str, str] | None = None) -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to a true value."""
    env = os.environ if env is None else env
    return (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").upper() in TRUE_VALUES


def repo_dir(repo_id: str, env: Mapping[str, str] | None = None) -> Path:
    return hub_cache_dir(env) / ("models--" + repo_id.replace("/", "--"))


def local_snapshot(repo_id: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The snapshot directory of `repo_id` at `main` if every file mlx_lm loads is there, else None.

    With the tree listing huggingface_hub cached for that commit, "every file" is exact; without
    one (a model fetched by an older tool), the config, the weights named by the safetensors
    index (or at least one model*.safetensors) and a tokenizer must be present.
    """
    folder = repo_dir(repo_id, env)
    try:
        commit = (folder / "refs" / REVISION).read_text().strip()
    except OSError:
        return None
    snapshot = folder / "snapshots" / commit
    if not commit or not snapshot.is_dir():
        return None
    listed = _tree_listing(folder / "trees" / f"{commit}.json")
    if listed is not None:
        expected = [path for path in listed if wanted(path)]
        return snapshot if expected and _all_files(snapshot, expected) else None
    return snapshot if _looks_complete(snapshot) else None


def _tree_listing(path: Path) -> list[str] | None:
    try:
        files = json.loads(path.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return list(files) if isinstance(files, dict) else None


def _all_files(base: Path, paths: Iterable[str]) -> bool:
    return all((base / path).is_file() for path in paths)  # is_file follows the blob symlinks


def _looks_complete(snapshot: Path) -> bool:
    if not (snapshot / "config.json").is_file():
        return False
    if not any((snapshot / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return False
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return bool(shards) and _all_files(snapshot, shards)
    return any(p.is_file() for p in snapshot.glob("model*.safetensors"))
