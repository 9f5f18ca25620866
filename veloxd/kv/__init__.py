"""KV-cache methods: configuration, registry, and `make_caches` (the public API).

Importing this package (or `config` / `registry`) does not import mlx; `make_caches`
imports it on first call.
"""

from __future__ import annotations

from typing import Any

from veloxd.kv import registry
from veloxd.kv.config import KVCacheConfig

__all__ = ["KVCacheConfig", "make_caches", "registry"]


def make_caches(model: Any, config: KVCacheConfig) -> list[Any]:
    """One fresh cache per layer of `model` for `config`.

    Plain attention layers get the method's cache; layers that are not plain attention
    (sliding-window, recurrent) keep the model's own cache type. Raises ValueError when the
    model cannot run the method's attention (it never falls back to fp16).
    """
    from veloxd.kv.factory import make_caches as _make_caches

    return _make_caches(model, config)
