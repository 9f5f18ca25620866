"""Refuse a model from its config.json, before any weight is read.

Everything a method needs that config.json already tells is checked here: an architecture whose
attention veloxd cannot route (MLX's fused kernel called directly), attention-sink logits
(gpt-oss style: softmax with a learned extra column the compressed caches do not model), and
head dimensions the method's group sizes or word packing do not divide (the per-method check is
the cache class's own `check_head_dims`, the same rule the cache applies when built).
"""

from __future__ import annotations

import sys
from typing import Any

from veloxd.kv.config import KVCacheConfig


def head_dims(config: dict[str, Any]) -> tuple[int, int] | None:
    """(key head dimension, value head dimension) from config.json, or None when it does not say."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    d = text.get("head_dim")
    if not isinstance(d, int):
        hidden, heads = text.get("hidden_size"), text.get("num_attention_heads")
        if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0):
            return None
        d = hidden // heads
    dv = text.get("v_head_dim", d)
    return d, dv if isinstance(dv, int) else d


def check(config: dict[str, Any], kv: KVCacheConfig) -> None:
    """ValueError naming the reason when `kv` cannot serve the model config.json describes."""
    if kv.method == "fp16":
        return
    from veloxd.kv.attention import module_source, refusal, unroutable_modules
    from veloxd.kv.factory import cache_class

    module = _model_module(config)
    if module is not None:
        culprits = unroutable_modules([module])
        if culprits:
            raise refusal(str(config.get("model_type")), culprits)
        if "sinks=" in module_source(module):
            raise ValueError(
                f"model type '{config.get('model_type')}' uses attention-sink logits (gpt-oss style); "
                "veloxd caches do not model them. Serve it with method fp16, or pick another model."
            )
    dims = head_dims(config)
    if dims is not None:
        cls: Any = cache_class(kv.method)
        cls.check_head_dims(kv, *dims)


def _model_module(config: dict[str, Any]) -> Any:
    from veloxd.serve.mlx_compat import model_classes

    try:
        model_class, _ = model_classes(config)
    except ValueError as err:  # mlx_lm does not know this architecture at all
        raise ValueError(f"unsupported architecture: {err}") from None
    return sys.modules.get(model_class.__module__)
