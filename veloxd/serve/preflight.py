"""Before any weight is read: find the model's config.json and ask veloxd.kv.preflight about it.

A local directory's config.json is read in place. For a Hugging Face id it comes from the local
hub cache (through veloxd.download.hub, the one module touching huggingface_hub); when it is not cached
and the hub is reachable (HF_HUB_OFFLINE unset), only that one file is fetched (mlx_lm would
download it first anyway). When no config.json can be had, the check is left to the load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from veloxd.kv import KVCacheConfig


def config_json(model: str) -> dict[str, Any] | None:
    local = Path(model).expanduser()
    if local.is_dir():
        path: str | Path | None = local / "config.json"
    else:
        from veloxd.download.hub import cached_or_fetched  # huggingface_hub only for a hub id

        path = cached_or_fetched(model, "config.json")
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # a broken config.json is the load's error to report, with its own message
    return data if isinstance(data, dict) else None


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
