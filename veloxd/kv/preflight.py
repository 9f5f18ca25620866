"""Refuse a model from its config.json, before any weight is read.

The model's skeleton is built from config.json exactly as mlx_lm's load builds it (its Model
class on its ModelArgs) but no weight is read and no array is evaluated: MLX initialises
parameters lazily, so this costs milliseconds and a few MB even for a large model. Its module
tree then answers what the loaded model will: whether veloxd can route its attention (the same
rule `install` applies at load, `veloxd.kv.attention.refusal_reason`, so a wrapper such as
smollm3 or mistral3 is judged by the llama or ministral3 modules it builds), and which layers
its own `make_cache` gives plain caches. Head dimensions the method's group sizes or word
packing do not divide are refused by the cache class's own `check_head_dims`, the same rule the
cache applies when built. After the load, `sharp_attention_warning` reads the same module tree for
READY's warnings (qk-norm models with key codes they lose most with).
"""

from __future__ import annotations

import copy
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
    from veloxd.kv.attention import check_routable, module_verdict, refusal
    from veloxd.kv.factory import cache_class, native_caches, plain_layers

    name = str(config.get("model_type"))
    model_class, skeleton = model_skeleton(config)
    if skeleton is not None:
        check_routable(skeleton, name)
        plain_layers(skeleton, native_caches(skeleton), kv.method)
    else:  # config.json too incomplete to build: judge the top module alone, the load reports the rest
        verdict = module_verdict(model_class.__module__)
        if verdict is not None:
            raise refusal(name, verdict, [sys.modules[model_class.__module__]])
    dims = head_dims(config)
    if dims is not None:
        cls: Any = cache_class(kv.method)
        cls.check_head_dims(kv, *dims)


def model_skeleton(config: dict[str, Any]) -> tuple[type, Any]:
    """(Model class, the model config.json describes with parameters unevaluated, or None if mlx_lm cannot build it).

    A config mlx_lm's ModelArgs or Model rejects is the load's error to report, with its own message.
    """
    from veloxd.serve.mlx_compat.models import model_classes

    try:
        model_class, args_class_ = model_classes(config)
    except ValueError as err:  # mlx_lm does not know this architecture at all
        raise ValueError(f"unsupported architecture: {err}") from None
    args_class: Any = args_class_  # an mlx_lm ModelArgs dataclass (BaseModelArgs.from_dict)
    try:
        return model_class, model_class(args_class.from_dict(copy.deepcopy(config)))  # from_dict may edit nested dicts
    except Exception:
        return model_class, None


# Norm layers a model applies to each head's queries and keys (qk-norm): qwen3, olmo2, gemma3,
# llama4 (`use_qk_norm`), lfm2 (`*_layernorm`).
QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"))
# Key codes whose error the logit scale multiplies most (docs/models.md, "Why gemma3_text and
# olmo2 lose more"): TurboQuant keys under 4 bits, and QJL's sign sketch at any width.
SHARP_KEY_BITS = 4


def normalises_queries_and_keys(model: Any) -> bool:
    """Whether any attention module of the (loaded or skeleton) model normalises q and k per head."""
    import mlx.nn as nn

    for module in model.modules():
        if getattr(module, "use_qk_norm", False) is True:
            return True
        if any(all(isinstance(getattr(module, n, None), nn.Module) for n in pair) for pair in QK_NORMS):
            return True
    return False


def sharp_attention_warning(model: Any, kv: KVCacheConfig) -> str | None:
    """A warning for READY when the method's key codes are the kind qk-norm families lose most with."""
    if kv.method == "qjl":
        setting = "its 1-bit key sketch"
    elif kv.method in ("turboquant_mse", "turboquant_prod"):
        key_bits = kv.turboquant_key_bits or kv.bit_width
        if key_bits >= SHARP_KEY_BITS:
            return None
        setting = f"{key_bits}-bit keys"
    else:
        return None
    if not normalises_queries_and_keys(model):
        return None
    from veloxd.kv.attention import model_type

    return (
        f"model type '{model_type(model)}' normalises queries and keys (qk-norm), which makes its attention "
        f"sharp: {kv.method} with {setting} loses several times more on such models than on others "
        f"(docs/models.md, 'Why gemma3_text and olmo2 lose more'); turboquant_key_bits: 4 or method "
        f"affine hold up better"
    )
