"""KV-cache methods: configuration, registry, and `make_caches` (the public API).

Importing this package (or `config` / `registry`) does not import mlx; `make_caches`
imports it on first call.
"""

from __future__ import annotations

from typing import Any

from veloxd.kv import registry
from veloxd.kv.config import KVCacheConfig, KVConfigError

__all__ = ["KVCacheConfig", "KVConfigError", "load_prompt_cache", "make_caches", "registry"]


def make_caches(model: Any, config: KVCacheConfig) -> list[Any]:
    """One fresh cache per layer of `model` for `config`.

    Plain attention layers get the method's cache; layers that are not plain attention
    (sliding-window, recurrent) keep the model's own cache type. Raises ValueError when the
    model cannot run the method's attention (it never falls back to fp16).
    """
    from veloxd.kv.factory import make_caches as _make_caches

    return _make_caches(model, config)


def load_prompt_cache(path: str, return_metadata: bool = False) -> Any:
    """mlx_lm's load_prompt_cache, with every veloxd cache class registered first."""
    from mlx_lm.models.cache import load_prompt_cache as _load

    from veloxd.kv.factory import import_methods

    import_methods()
    return _load(path, return_metadata=return_metadata)
