"""The transient memory of one attention call is bounded, for every method.

MLX's peak-memory counter is reset around one `attend` of a prefill block and of a decode step,
with the cache holding 16 key blocks (block = 64 keys, so the sizes stay small), at GQA ratios 1,
2, 4, 7, 8 and 16 and head dimensions 64, 96 and 128 (80 for the eviction methods; the quantizers
pack in 32-element groups and refuse it before load). The peak above what was held before the call must stay
under `transient_bound` (veloxd.kv.ops.blockwise states it): for a prefill chunk it does not grow
with the cache (dequantizing the whole cache, 16 blocks, would exceed it); for a decode step it is
the scores (B * Hq * T floats) plus the step's I/O, under a float32 copy of the whole cache.
Eviction caches hold fp16 slots, which a prefill chunk reads in one span when the score bound
allows (a block of them is a view, not a copy): their prefill bound is taken at that span.
Hybrids read packed slots BLOCK at a time, and may keep a query block's exponentials over every
slot for the policy's weights (`kept_weight_rows`): their bound counts those.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec
from veloxd.kv.config import WINDOWED
from veloxd.kv.factory import cache_class
from veloxd.kv.ops.blockwise import one_span_block, transient_bound

N_KV = 2
BLOCK = 64
CONTEXT = 16 * BLOCK
CHUNK = 64
METHODS = [m for m in registry.names() if m != "fp16"]
EVICTION = [m for m in METHODS if registry.get(m).family == "eviction"]
HYBRIDS = [m for m in METHODS if registry.get(m).family == "hybrid"]
# d 96 is not a multiple of the 64-element default groups of affine and QJL's values
GROUPS_96 = {"affine": {"affine_group_size": 32}, "qjl": {"qjl_value_group_size": 32}}
GROUPS_96 |= {h.name: GROUPS_96["affine"] for h in registry.HYBRIDS}  # policies over affine codes
CASES = [
    pytest.param(m, g, d, {}, id=f"{m}-gqa{g}-d{d}")
    for m in METHODS
    for g in (1, 2, 4, 7, 8, 16)
    for d in (64, 96, 128)
]
CASES += [pytest.param(m, g, 80, {}, id=f"{m}-gqa{g}-d80") for m in EVICTION for g in (1, 4, 16)]
# codes that straddle bytes, whose prefill blocks veloxd.kv.ops.dequant unpacks with shifts
STRADDLING = {
    "affine-3": ("affine", {"bits": 3}),
    "affine-6": ("affine", {"bits": 6}),
    "turboquant_mse-3-uniform": ("turboquant_mse", {"bits": 3, "turboquant_codebook": "uniform"}),
    "turboquant_prod-4-uniform": ("turboquant_prod", {"turboquant_codebook": "uniform"}),
}
CASES += [
    pytest.param(m, g, d, fields, id=f"{name}-gqa{g}-d{d}")
    for name, (m, fields) in STRADDLING.items()
    for g in (1, 4, 16)
    for d in (64, 128)
]


def tensors(n_q: int, L: int, d: int, seed: int) -> tuple[mx.array, mx.array, mx.array]:
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    keys = mx.random.normal((1, N_KV, L, d), key=k1).astype(mx.float16)
    values = mx.random.normal((1, N_KV, L, d), key=k2).astype(mx.float16)
    queries = mx.random.normal((1, n_q, L, d), key=k3).astype(mx.float16)
    mx.eval(keys, values, queries)
    return queries, keys, values


def filled(method: str, d: int, tokens: int, fields: dict[str, Any]) -> Any:
    """A cache holding `tokens` tokens (default settings but `fields`: eviction budgets of 1024 are
    not reached)."""
    fields = fields | (GROUPS_96.get(method, {}) if d == 96 else {})
    cache = cache_class(method)(KVCacheConfig(method=method, **fields), LayerSpec(0, 1))
    cache.block = BLOCK
    for start in range(0, tokens, 256):
        _, keys, values = tensors(1, min(256, tokens - start), d, seed=start)
        cache.update_and_fetch(keys, values)
    mx.eval(cache.arrays())
    return cache


def exact_tokens(cache: Any) -> int:
    """Full-precision tokens the method keeps beside its codes (set by its configuration)."""
    config = cache.config
    if config.method == "kivi":
        return config.kivi_residual_length + 2 * config.kivi_group_size  # residual plus groups to flush
    if config.method in WINDOWED:
        return config.recent_window + 1  # the window plus the step's own token
    return 0


def attend_peak(cache: Any, queries: mx.array, keys: mx.array, values: mx.array) -> int:
    """Peak bytes above the memory held before one attention call (the append is done first)."""
    cache.update_and_fetch(keys, values)
    mx.eval(cache.arrays())
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    out = cache.attend(queries, queries.shape[-1] ** -0.5, "causal" if queries.shape[2] > 1 else None)
    mx.eval(out, cache.arrays())
    return mx.get_peak_memory() - before


@pytest.mark.parametrize(("method", "gqa", "d", "fields"), CASES)
def test_prefill_block_and_decode_step_stay_under_the_stated_bound(
    method: str, gqa: int, d: int, fields: dict[str, Any]
) -> None:
    n_q = N_KV * gqa
    cache = filled(method, d, CONTEXT - CHUNK - 1, fields)
    prefill = attend_peak(cache, *tensors(n_q, CHUNK, d, seed=1))
    decode = attend_peak(cache, *tensors(n_q, 1, d, seed=2))
    whole_cache_fp16 = CONTEXT * N_KV * 2 * d * 2
    # dense slots (eviction) in one span over the cache and the chunk, packed forms BLOCK at a time;
    # packed slots (hybrids) may keep one query block's exponentials over every slot for its weights
    slots = cache.size() + CHUNK
    span = one_span_block(1, n_q, CHUNK, slots, BLOCK) if method in EVICTION else BLOCK
    prefill_bound = transient_bound(1, n_q, N_KV, CHUNK, d, d, span, length=slots, weights=method in HYBRIDS)
    decode_block = getattr(getattr(cache, "codec", None), "decode_block", None)  # Lloyd-Max: blocks
    decode_block = None if decode_block is None else min(decode_block, BLOCK)
    decode_bound = transient_bound(
        1, n_q, N_KV, 1, d, d, BLOCK, length=cache.size(), decode_block=decode_block, exact=exact_tokens(cache)
    )
    assert 0 < prefill <= prefill_bound, f"prefill peak {prefill} > bound {prefill_bound}"
    assert 0 < decode <= decode_bound, f"decode peak {decode} > bound {decode_bound}"
    # no decoded copy of the whole cache, not even transiently: under one float32 copy of it
    assert decode < whole_cache_fp16 * 2, f"decode peak {decode} >= a float32 copy {whole_cache_fp16 * 2}"
