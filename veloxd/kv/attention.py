"""The attention dispatcher: the one place veloxd patches mlx_lm.

mlx_lm model files bind `scaled_dot_product_attention` from `mlx_lm.models.base` by name at
import, so the patch replaces that attribute in each loaded model module. The dispatcher
sends attention for veloxd caches to `cache.attend(queries, scale, mask)` (computed from the
compressed form) and everything else to mlx_lm's original function, unchanged.

Which modules make up a model is read from the model's own module tree (a wrapper such as
smollm3 or mistral3 has no attention of its own; the llama or ministral3 modules it builds do).
A model whose attention veloxd cannot compute from a compressed cache is refused with the true
reason (`refusal_reason`): the fused kernel called directly, attention computed by hand (with
or without logit soft-capping), attention-sink logits, or one layer's cache read back as arrays
by later layers. It is never served uncompressed.
Each module's source is read once per process (`module_verdict` is memoized), and routing is
installed once at wiring: a request builds caches without reading any source.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from types import ModuleType
from typing import Any

from mlx_lm.models import base as mlx_base

from veloxd.kv.base import Stored, VeloxCache

_original = mlx_base.scaled_dot_product_attention
_PATCHED = "scaled_dot_product_attention"  # the name model files bind (see above)

# Why a module's attention cannot be computed from a veloxd cache (None: it can, or it has none).
FUSED = "computes attention with MLX's fused kernel directly"
SOFTCAP = "applies attention logit soft-capping (tanh on the attention scores), which veloxd caches do not apply"
BY_HAND = "computes attention by hand, not through mlx_lm's scaled_dot_product_attention"
SINKS = "uses attention-sink logits (gpt-oss style: a learned extra softmax column), which veloxd caches do not model"
KV_READ_BACK = (
    "reads an earlier layer's cached keys and values back as arrays (KV sharing), which veloxd's compressed "
    "caches do not give out"
)
# Not a module verdict: the factory's, for eviction methods on a model with fewer caches than layers.
KV_SHARED = "shares one layer's cache with later layers (KV sharing), which an eviction policy cannot serve"
NO_ATTENTION = "has no attention through mlx_lm's scaled_dot_product_attention (nothing veloxd could compress)"
_SINKS_PASSED = re.compile(r"\bsinks=(?!None\b)")
_HAND_SOFTMAX = re.compile(r"softmax\(\s*scores")
_HAND_SOFTCAP = re.compile(r"tanh\(\s*scores")
_KV_READBACK = ".keys_and_values()"  # gemma3n: shared layers read an earlier layer's cache as arrays


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


def classify(source: str, binds_patchable: bool) -> str | None:
    """The reason a module with this source cannot be routed, or None. Pure: tested on text."""
    if "mx.fast.scaled_dot_product_attention(" in source:
        return FUSED
    if not binds_patchable:
        if _HAND_SOFTCAP.search(source):
            return SOFTCAP
        if _HAND_SOFTMAX.search(source):
            return BY_HAND
        return None  # a wrapper (or a module without attention): the modules it builds decide
    if _SINKS_PASSED.search(source):
        return SINKS
    if _KV_READBACK in source:
        return KV_READ_BACK
    return None


@functools.cache
def module_verdict(name: str) -> str | None:
    """`classify` for a loaded mlx_lm module, its source read once per process."""
    module = sys.modules[name]
    return classify(module_source(module), hasattr(module, _PATCHED))


def refusal_reason(modules: list[ModuleType]) -> tuple[str, list[ModuleType]] | None:
    """(reason, culprit modules) when the model built from `modules` cannot be routed, else None."""
    by_reason: dict[str, list[ModuleType]] = {}
    for module in modules:
        verdict = module_verdict(module.__name__)
        if verdict is not None:
            by_reason.setdefault(verdict, []).append(module)
    for reason in (FUSED, SOFTCAP, BY_HAND, SINKS, KV_READ_BACK):  # the most fundamental reason first
        if reason in by_reason:
            return reason, by_reason[reason]
    if not any(hasattr(m, _PATCHED) for m in modules):
        return NO_ATTENTION, modules  # e.g. a state-space model
    return None


def refusal(model_type_name: str, reason: str, culprits: list[ModuleType]) -> ValueError:
    names = ", ".join(m.__name__ for m in culprits)
    return ValueError(
        f"model type '{model_type_name}' {reason} ({names}); veloxd cannot compute its attention from a "
        "compressed cache. Serve it with method fp16, or pick another model."
    )


def check_routable(model: Any, model_type_name: str | None = None) -> None:
    """ValueError with the true reason unless every attention in `model` can be routed."""
    found = refusal_reason(model_modules(model))
    if found is not None:
        raise refusal(model_type_name or model_type(model), *found)


def install(model: Any) -> int:
    """Route `model`'s attention through the dispatcher; returns how many modules were patched.

    Idempotent and cheap after the first call for a model's modules (no source is read again);
    the worker calls it once at wiring, `make_caches` for Python API users.
    """
    check_routable(model)
    patched = 0
    for module in model_modules(model):
        current = getattr(module, _PATCHED, None)
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
