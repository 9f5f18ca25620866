"""The speed benchmark's model, arms and cache filling (benchmarks/kv/speed.py runs them).

Model (the shape the speed goals were first measured on): a 2-layer random-weight llama with an
8B-like attention shape, 8 query heads, 2 KV heads, head_dim 128, hidden 1024, float32.
Filling: eviction and hybrid caches by prefill in 1024-token chunks (what they keep is chosen from
the attention). Every other cache takes random keys and values of the model's shapes written
straight into each layer's cache in 1024-token chunks, each chunk followed by one single-query read
(as a decode step would, so a recent window is cut back to its size): a decode step's time depends
on how many tokens are held and in what form, not on their values, and a 32k prefill through
attention would cost far more than the decode being measured. A batch of 4 is the single request's caches merged four times (as mlx_lm's BatchGenerator merges
them); mlx_lm's QuantizedKVCache has no `merge`, so its rows are concatenated.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import llama
from mlx_lm.models.cache import QuantizedKVCache

from benchmarks.kv.arms import PEER, Arm, eviction_settings
from veloxd.kv import registry
from veloxd.kv.base import VeloxCache

VOCAB = 512
PREFILL_CHUNK = 1024
EVICTION_BUDGET = 1024  # tokens per layer an eviction arm keeps (the snapkv figure)


def build_model(seed: int = 0) -> Any:
    """The random-weight llama (float32), evaluated."""
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=1024,
        num_hidden_layers=2,
        intermediate_size=2816,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    )
    model = llama.Model(args)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


UNIFORM = {"turboquant_codebook": "uniform"}
MSE_2_K4 = {"turboquant_key_bits": 4, "recent_window": 16}


def arms() -> list[Arm]:
    """fp16, mlx_lm's 4-bit and 3-bit peers, and every veloxd method (Lloyd-Max and uniform TurboQuant)."""
    out = [Arm("fp16", "fp16", "baseline"), Arm("mlx-q4", PEER, "peer", 4), Arm("mlx-q3", PEER, "peer", 3)]
    out += [
        Arm("affine-4", "affine", "quantization", 4),
        Arm("kivi-4", "kivi", "quantization", 4),
        Arm("kivi-2", "kivi", "quantization", 2),
        Arm("turboquant_mse-3", "turboquant_mse", "quantization", 3),
        Arm("turboquant_mse-3-uniform", "turboquant_mse", "quantization", 3, UNIFORM),
        Arm("turboquant_prod-4", "turboquant_prod", "quantization", 4),
        Arm("turboquant_prod-4-uniform", "turboquant_prod", "quantization", 4, UNIFORM),
        # the settings docs/caches.md gives at mlx_lm's footprints
        Arm("affine-4-g128-w16", "affine", "quantization", 4, {"affine_group_size": 128, "recent_window": 16}),
        Arm("turboquant_mse-2-k4-w16", "turboquant_mse", "quantization", 2, MSE_2_K4),
        Arm("turboquant_mse-2-k4-w16-uniform", "turboquant_mse", "quantization", 2, MSE_2_K4 | UNIFORM),
        Arm("qjl", "qjl", "quantization", None),
        Arm("qjl-s128", "qjl", "quantization", None, {"qjl_sketch_dim": 128}),
    ]
    for info in registry.METHODS:
        if info.family == "eviction":
            out.append(Arm(info.name, info.name, "eviction", None, eviction_settings(info.name, EVICTION_BUDGET)))
    for info in registry.METHODS:
        if info.family == "hybrid":
            settings = eviction_settings(info.parts[0], EVICTION_BUDGET)
            out.append(Arm(f"{info.name}-{info.default_bits}", info.name, "hybrid", info.default_bits, settings))
    return out


def tokens(n: int, batch: int = 1, seed: int = 1) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.integers(0, VOCAB, size=(batch, n)), dtype=mx.int32)


def prefill(model: Any, caches: list[Any], prompt: mx.array, chunk: int = PREFILL_CHUNK) -> mx.array:
    """Feed prompt [B, T] in chunks; returns the last logits (evaluated)."""
    logits = None
    for start in range(0, prompt.shape[1], chunk):
        logits = model(prompt[:, start : start + chunk], cache=caches)
        mx.eval(logits, [c.state for c in caches])
    assert logits is not None
    return logits


def filled(model: Any, arm: Arm, context: int) -> list[Any]:
    """One request's caches holding `context` tokens (see the module docstring for how)."""
    caches = arm.make_caches(model)
    if arm.family in ("eviction", "hybrid"):
        prefill(model, caches, tokens(context))
    else:
        written(model, caches, context)
    return caches


def written(model: Any, caches: list[Any], context: int, seed: int = 4) -> None:
    """Random post-RoPE keys and values [1, Hkv, chunk, D] straight into every layer's cache."""
    args = model.args
    shape = (1, args.num_key_value_heads, 0, args.head_dim)
    scale = args.head_dim**-0.5
    key = mx.random.key(seed)
    for start in range(0, context, PREFILL_CHUNK):
        n = min(PREFILL_CHUNK, context - start)
        for cache in caches:
            key, k_key, v_key, q_key = mx.random.split(key, 4)
            keys = mx.random.normal(shape[:2] + (n, shape[3]), key=k_key)  # [1, Hkv, n, D]
            values = mx.random.normal(shape[:2] + (n, shape[3]), key=v_key)
            cache.update_and_fetch(keys, values)
            if isinstance(cache, VeloxCache):
                query = mx.random.normal((1, args.num_attention_heads, 1, shape[3]), key=q_key)  # [1, Hq, 1, D]
                mx.eval(cache.attend(query, scale, None))
            mx.eval(cache.state)


def batched(caches: list[Any], n: int) -> list[Any] | None:
    """The caches of n copies of one request, batched (None when the cache cannot batch)."""
    out = []
    for cache in caches:
        if isinstance(cache, QuantizedKVCache):
            out.append(_stacked_quantized(cache, n))
        elif hasattr(type(cache), "merge"):
            out.append(type(cache).merge([copy.deepcopy(cache) for _ in range(n)]))
        else:
            return None
    return out


def _stacked_quantized(cache: Any, n: int) -> Any:
    """mlx_lm's QuantizedKVCache with its one row repeated n times (every array is [B, H, T, ..])."""
    out: Any = QuantizedKVCache(group_size=cache.group_size, bits=cache.bits)
    keys, values = (tuple(a[..., : cache.offset, :] for a in t) for t in (cache.keys, cache.values))
    out.keys = tuple(mx.concatenate([a] * n) for a in keys)  # [n, H, T, ..]
    out.values = tuple(mx.concatenate([a] * n) for a in values)
    out.offset = cache.offset
    mx.eval(out.keys, out.values)
    return out
