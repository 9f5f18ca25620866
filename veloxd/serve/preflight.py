"""Before any weight is read: find the model's config.json and ask veloxd.kv.preflight about it.

A local directory's config.json is read in place. For a Hugging Face id it comes from the local
hub cache (HF_HUB_CACHE layout, `huggingface_hub.try_to_load_from_cache`); when it is not cached
and the hub is reachable (HF_HUB_OFFLINE unset), only that one file is fetched (mlx_lm would
download it first anyway). When no config.json can be had, the check is left to the load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from veloxd.kv import KVCacheConfig


def config_json(model: str) -> dict[str, Any] | None:
    local = Path(model).expanduser()
    if local.is_dir():
        path: str | Path | None = local / "config.json"
    else:
        path = _hub_config(model)
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # a broken config.json is the load's error to report, with its own message
    return data if isinstance(data, dict) else None


def _hub_config(repo_id: str) -> str | None:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    try:
        return hf_hub_download(repo_id, "config.json")
    except Exception:  # network or hub error: the load reports it
        return None


def refusal(model: str, kv: KVCacheConfig) -> str | None:
    """The error line when config.json shows `kv` cannot serve `model`; None otherwise."""
    if kv.method == "fp16":
        return None
    config = config_json(model)
    if config is None:
        return None
    from veloxd.kv.preflight import check  # imports mlx_lm's model registry

    try:
        check(config, kv)
    except ValueError as err:
        return f"error: cannot serve {model} with method {kv.method}: {err}"
    return None
