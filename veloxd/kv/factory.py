"""`make_caches(model, config)`: one fresh cache list per request.

The per-layer cache kinds come from mlx_lm's own `make_cache` wherever the model defines it: on
its class, on the instance, or on a nested `language_model` / `model` (wrappers such as mistral3
keep it on the model they wrap), so sliding-window layers keep mlx_lm's rotating caches. The
worker sets an instance `make_cache` of its own (`per_request`); that one is marked and skipped,
or reading it here would recurse into it. Someone else's instance closure that calls back into
`make_caches` is refused with a clear error instead of recursing (`_building`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from mlx_lm.models import cache as mlx_cache

from veloxd.kv import registry
from veloxd.kv.attention import KV_SHARED, install, model_type
from veloxd.kv.base import LayerSpec
from veloxd.kv.config import KVCacheConfig

_OURS = "veloxd_per_request"  # marks the worker's own make_cache closure
_NESTED = ("language_model", "model")  # where wrappers keep the model they wrap
_building = threading.local()  # ids of the models whose instance make_cache is running on this thread


def own_make_cache(model: Any) -> Callable[[], Any] | None:
    """The model's own make_cache (instance, class, then nested wrapped model), or None."""
    instance = vars(model).get("make_cache")
    if instance is not None and not getattr(instance, _OURS, False):
        return lambda: _guarded(model, instance)
    if getattr(type(model), "make_cache", None) is not None:
        return lambda: type(model).make_cache(model)
    for name in _NESTED:
        inner = getattr(model, name, None)
        if inner is not None and inner is not model and hasattr(inner, "named_modules"):
            found = own_make_cache(inner)
            if found is not None:
                return found
    return None


def _guarded(model: Any, make: Callable[[], Any]) -> Any:
    active: set[int] = getattr(_building, "ids", set())
    if id(model) in active:
        raise ValueError(
            "the model's instance make_cache calls back into veloxd's make_caches; set it with "
            "veloxd.kv.factory.per_request(model, config), which the factory knows to skip"
        )
    _building.ids = active | {id(model)}
    try:
        return make()
    finally:
        _building.ids = active


def native_caches(model: Any) -> list[Any]:
    """The caches the model would build itself (its own make_cache, or one KVCache per layer)."""
    make = own_make_cache(model)
    if make is not None:
        return list(make())
    return [mlx_cache.KVCache() for _ in model.layers]


def import_methods() -> None:
    """Import every method's module, registering its classes for mlx_lm's load_prompt_cache."""
    for name in registry.names():
        cache_class(name)


def cache_class(method: str) -> type:
    module_name, class_name = registry.get(method).impl.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def plain_layers(model: Any, native: list[Any], method: str) -> list[int]:
    """Indexes of the layers a veloxd cache replaces (mlx_lm's plain KVCache); ValueError if `method` cannot.

    Fewer caches than layers means later layers attend over an earlier layer's cache (KV sharing,
    Gemma 4): a quantizer's attention serves any layer's queries, an eviction policy scores only
    its own layer's, so it is refused.
    """
    name = model_type(model)
    plain = [i for i, c in enumerate(native) if type(c) is mlx_cache.KVCache]
    if not plain:
        kinds = sorted({type(c).__name__ for c in native})
        raise ValueError(
            f"model type '{name}' has no plain attention layer to compress (its caches: "
            f"{', '.join(kinds) or 'none'}). Serve it with method fp16, or pick another model."
        )
    if registry.get(method).evicts and len(native) < len(model.layers):
        raise ValueError(
            f"model type '{name}' {KV_SHARED}: {len(model.layers) - len(native)} of its {len(model.layers)} "
            f"layers attend over an earlier layer's cache, and method {method} evicts by its own layer's "
            "attention only. Serve it with a quantization method (affine, kivi, turboquant_*, qjl) or fp16."
        )
    return plain


def build_caches(model: Any, config: KVCacheConfig) -> list[Any]:
    """Fresh caches for one request, attention routing already installed (no source is read)."""
    native = native_caches(model)
    if config.method == "fp16":
        return native
    cls = cache_class(config.method)
    plain = plain_layers(model, native, config.method)
    caches = list(native)
    for position, layer_index in enumerate(plain):
        caches[layer_index] = cls(config, LayerSpec(position, len(plain)))
    return caches


def make_caches(model: Any, config: KVCacheConfig) -> list[Any]:
    """Route the model's attention (refusing it with the true reason) and build its caches."""
    if config.method != "fp16":
        install(model)
    return build_caches(model, config)


def per_request(model: Any, config: KVCacheConfig) -> Callable[[], list[Any]]:
    """The instance make_cache the worker installs after wiring: builds caches, routes nothing."""

    def make_cache() -> list[Any]:
        return build_caches(model, config)

    setattr(make_cache, _OURS, True)
    return make_cache
