"""Attach veloxd caches to a loaded model and measure what they hold.

Runs on mlx_lm's generation thread (MLX arrays belong to the thread that made them). One probe
cache list answers layer count and batchability, and a 256-token probe prefill through it both
proves the method's attention runs on this model and measures bytes per token — measured
`nbytes`, next to the fp16 cache's on the same tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from veloxd.kv import KVCacheConfig, make_caches, registry
from veloxd.kv.factory import native_caches

PROBE_TOKENS = 256  # one mlx_lm KVCache step: the fp16 figure carries no padding


@dataclass(frozen=True)
class Wiring:
    layer_caches: dict[str, int]
    batchable: bool
    kv_bytes_per_token: dict[str, Any]


def _prefill_bytes(model: Any, caches: list[Any], tokens: mx.array) -> int:
    model(tokens, cache=caches)
    mx.eval([c.state for c in caches])
    return sum(c.nbytes for c in caches)


def wire_caches(model: Any, config: KVCacheConfig) -> Wiring:
    """Probe, measure, then make every request build a fresh cache list. Raises ValueError if unservable."""
    probe = make_caches(model, config)
    batchable = registry.get(config.method).batchable and all(hasattr(c, "merge") for c in probe)
    vocab = int(getattr(getattr(model, "args", None), "vocab_size", 0) or 256)
    tokens = (mx.arange(PROBE_TOKENS) * 7919 % vocab)[None]  # [1, 256] a fixed, varied prompt
    method_bytes = _prefill_bytes(model, probe, tokens)
    fp16_bytes = _prefill_bytes(model, native_caches(model), tokens)
    counts = Counter(type(c).__name__ for c in probe)
    # Instance attribute: mlx_lm's make_prompt_cache calls it per request. make_caches reads the
    # model's make_cache from the class, so this never recurses.
    model.make_cache = lambda: make_caches(model, config)
    return Wiring(
        layer_caches=dict(counts),
        batchable=batchable,
        kv_bytes_per_token={
            "method": round(method_bytes / PROBE_TOKENS, 1),
            "fp16": round(fp16_bytes / PROBE_TOKENS, 1),
            "ratio": round(method_bytes / fp16_bytes, 4) if fp16_bytes else None,
            "tokens": PROBE_TOKENS,
            "source": "measured: nbytes of every layer cache after a probe prefill",
        },
    )
