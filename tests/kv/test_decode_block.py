"""A decode step reads smaller key blocks (blockwise.DECODE_BLOCK): same output, smaller transient.

For every method, at GQA ratios 1 to 16 and head dimensions 64 to 128 (80 only for the eviction
methods: the quantizers pack in 32-element groups and refuse it before load), one decode step over
a cache of several blocks gives the same attention output with the decode block as with one
1024-key block, and its transient stays under the stated bound. KIVI cuts its quantized keys only
at group boundaries, so its decode block is its group size when that is larger (groups 64, 128).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec
from veloxd.kv.factory import cache_class
from veloxd.kv.ops import blockwise

N_KV = 2
CONTEXT = 700  # spans 22 decode blocks of 32 keys, one 1024-key block
SHAPES = [(1, 64), (2, 96), (4, 128), (7, 96), (8, 64), (16, 128)]
EVICTION = [m for m in registry.names() if registry.get(m).family == "eviction"]
# d 96 is not a multiple of the 64-element default groups of affine and QJL's values
GROUPS_96 = {"affine": {"affine_group_size": 32}, "qjl": {"qjl_value_group_size": 32}}
GROUPS_96 |= {h.name: GROUPS_96["affine"] for h in registry.HYBRIDS}  # policies over affine codes
CASES = [
    pytest.param(m, g, d, GROUPS_96.get(m, {}) if d == 96 else {}, id=f"{m}-gqa{g}-d{d}")
    for m in registry.names()
    if m != "fp16"
    for g, d in SHAPES
]
CASES += [pytest.param(m, 4, 80, {}, id=f"{m}-gqa4-d80") for m in EVICTION]
CASES += [pytest.param("kivi", 8, 128, {"kivi_group_size": g}, id=f"kivi-group{g}") for g in (64, 128)]


def filled(method: str, n_q: int, d: int, fields: dict[str, Any]) -> Any:
    """A cache holding CONTEXT tokens, filled as a server would: prefill chunks, each attended."""
    cache = cache_class(method)(KVCacheConfig(method=method, **fields), LayerSpec(0, 1))
    key = mx.random.key(3)
    for start in range(0, CONTEXT, 128):
        n = min(128, CONTEXT - start)
        k1, k2, k3, key = mx.random.split(key, 4)
        keys = mx.random.normal((1, N_KV, n, d), key=k1).astype(mx.float16)
        values = mx.random.normal((1, N_KV, n, d), key=k2).astype(mx.float16)
        cache.update_and_fetch(keys, values)
        mx.eval(cache.attend(mx.random.normal((1, n_q, n, d), key=k3).astype(mx.float16), d**-0.5, "causal"))
    return cache


@pytest.mark.parametrize(("method", "gqa", "d", "fields"), CASES)
def test_decode_block_output_equals_one_large_block(method, gqa, d, fields, monkeypatch) -> None:
    n_q = N_KV * gqa
    k1, k2, k3 = mx.random.split(mx.random.key(7), 3)
    keys = mx.random.normal((1, N_KV, 1, d), key=k1).astype(mx.float16)
    values = mx.random.normal((1, N_KV, 1, d), key=k2).astype(mx.float16)
    queries = mx.random.normal((1, n_q, 1, d), key=k3).astype(mx.float16)
    outs, peaks = [], []
    for decode_block in (1024, blockwise.DECODE_BLOCK):
        monkeypatch.setattr(blockwise, "DECODE_BLOCK", decode_block)
        cache = filled(method, n_q, d, fields)  # the same tokens and decisions for both runs
        cache.update_and_fetch(keys, values)
        mx.eval(cache.arrays())
        mx.clear_cache()
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        out = cache.attend(queries, d**-0.5, None)
        mx.eval(out, cache.arrays())
        peaks.append(mx.get_peak_memory() - before)
        outs.append(out.astype(mx.float32))
    assert outs[0].shape == (1, n_q, 1, d)
    # online softmax over smaller blocks: equal up to float16 rounding of the partial sums
    assert mx.allclose(outs[0], outs[1], atol=2e-3, rtol=2e-2).item(), mx.abs(outs[0] - outs[1]).max().item()
    align = fields.get("kivi_group_size", 32) if method == "kivi" else 1
    bound = blockwise.transient_bound(1, n_q, N_KV, 1, d, d, align=align)
    assert 0 < peaks[1] <= bound, (peaks, bound)
    assert blockwise.key_block(1, align=align) == max(align, blockwise.DECODE_BLOCK)
