"""`make_caches(model, config)`: one fresh cache list per request.

The model's own `make_cache` is looked up on its class, never on the instance: the worker
replaces the instance attribute with a closure that calls this function, and reading the
instance attribute here would recurse into it (an infinite recursion: make_cache -> make_caches -> make_cache).
"""

from __future__ import annotations

import importlib
from typing import Any

from mlx_lm.models import cache as mlx_cache

from veloxd.kv import registry
from veloxd.kv.attention import install
from veloxd.kv.base import LayerSpec
from veloxd.kv.config import KVCacheConfig


def native_caches(model: Any) -> list[Any]:
    """The caches the model would build itself (class-level make_cache, or one KVCache per layer)."""
    make = getattr(type(model), "make_cache", None)
    if make is not None:
        return list(make(model))
    return [mlx_cache.KVCache() for _ in model.layers]


def import_methods() -> None:
    """Import every method's module, registering its classes for mlx_lm's load_prompt_cache."""
    for name in registry.names():
        cache_class(name)


def cache_class(method: str) -> type:
    module_name, class_name = registry.get(method).impl.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make_caches(model: Any, config: KVCacheConfig) -> list[Any]:
    native = native_caches(model)
    if config.method == "fp16":
        return native
    install(model)
    cls = cache_class(config.method)
    plain = [i for i, c in enumerate(native) if type(c) is mlx_cache.KVCache]
    if not plain:
        raise ValueError(f"model type '{type(model).__module__}' has no plain attention layer to compress")
    caches = list(native)
    for position, layer_index in enumerate(plain):
        caches[layer_index] = cls(config, LayerSpec(position, len(plain)))
    return caches
