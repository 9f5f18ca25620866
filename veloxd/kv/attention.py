"""The attention dispatcher: the one place veloxd patches mlx_lm.

mlx_lm model files bind `scaled_dot_product_attention` from `mlx_lm.models.base` by name at
import, so the patch replaces that attribute in each loaded model module. The dispatcher
sends attention for veloxd caches to `cache.attend(queries, scale, mask)` (computed from the
compressed form) and everything else to mlx_lm's original function, unchanged.

A model whose attention calls MLX's fused kernel directly cannot be routed: `install` raises
ValueError naming the model type; it is never served uncompressed.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any

from mlx_lm.models import base as mlx_base

from veloxd.kv.base import Stored, VeloxCache

_original = mlx_base.scaled_dot_product_attention
_PATCHED = "scaled_dot_product_attention"  # the name model files bind (see above)


def dispatch_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """Drop-in for mlx_lm's scaled_dot_product_attention (same signature)."""
    if isinstance(cache, VeloxCache):
        if sinks is not None:
            raise ValueError("veloxd caches do not support attention-sink logits (gpt-oss style)")
        return cache.attend(queries, scale, mask)
    if isinstance(keys, Stored):  # a veloxd cache reached attention under another object
        return keys.cache.attend(queries, scale, mask)
    return _original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


def model_modules(model: Any) -> list[ModuleType]:
    """The mlx_lm model modules whose classes make up `model` (its attention lives there)."""
    names = {type(m).__module__ for _, m in model.named_modules()} | {type(model).__module__}
    return [sys.modules[n] for n in sorted(names) if n.startswith("mlx_lm.models.") and n in sys.modules]


def model_type(model: Any) -> str:
    args = getattr(model, "args", None)
    return str(getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1])


def unroutable_modules(modules: list[ModuleType]) -> list[ModuleType]:
    """Modules whose attention bypasses the patchable function (calls the fused kernel directly)."""
    return [
        m
        for m in modules
        if not hasattr(m, "scaled_dot_product_attention") or "mx.fast.scaled_dot_product_attention(" in module_source(m)
    ]


def refusal(model_type_name: str, culprits: list[ModuleType]) -> ValueError:
    names = ", ".join(m.__name__ for m in culprits)
    return ValueError(
        f"model type '{model_type_name}' computes attention with MLX's fused kernel directly "
        f"({names}); veloxd cannot compute its attention from a compressed cache. "
        "Serve it with method fp16, or pick another model."
    )


def check_routable(model: Any) -> None:
    """ValueError unless every attention in the loaded `model` goes through the patchable function."""
    modules = model_modules(model)
    routable = [m for m in modules if hasattr(m, "scaled_dot_product_attention")]
    direct = [m for m in modules if "mx.fast.scaled_dot_product_attention(" in module_source(m)]
    if not routable or direct:
        raise refusal(model_type(model), direct or modules)


def install(model: Any) -> int:
    """Route `model`'s attention through the dispatcher; returns how many modules were patched."""
    check_routable(model)
    patched = 0
    for module in model_modules(model):
        current = getattr(module, "scaled_dot_product_attention", None)
        if current is dispatch_attention:
            patched += 1
        elif current is _original:
            setattr(module, _PATCHED, dispatch_attention)  # a module attribute mypy cannot see
            patched += 1
        elif current is not None:
            raise ValueError(f"{module.__name__}.scaled_dot_product_attention was replaced by someone else")
    return patched


def module_source(module: ModuleType) -> str:
    """The module's source text ('' when unavailable)."""
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return ""
