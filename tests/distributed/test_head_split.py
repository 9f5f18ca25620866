"""A tensor-parallel rank's attention over its share of the heads is bit for bit that share of
the full attention (in process, MLX arrays, no group).

With tensor parallelism each rank holds Hkv/n KV heads and Hq/n query heads (the GQA ratio R is
unchanged). blockwise_attention sizes its query blocks from the local Hq, so a rank splits the
same prompt into other query blocks than one process does. A quantizer that chose its arithmetic
per query block (packed quantized_matmul for a few rows, dequantize + matmul for many) sent the
same query row down different arithmetic on a rank and in one process: different bits, then
different codes downstream. The choice is per attention call now (`reads_dense`); these tests
build exactly the prompt length whose last query block is one row in one process and part of a
larger block on a rank holding half the heads.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from veloxd.kv import KVCacheConfig
from veloxd.kv.base import LayerSpec
from veloxd.kv.factory import cache_class
from veloxd.kv.ops.blockwise import query_block
from veloxd.kv.quant.affine import AffineCache

BLOCK = 1 << 14  # keys per block: large, so the score bound splits even a short prompt into query blocks
KV_HEADS = 2  # one process; a rank of two holds 1
DECODE_STEPS = 3
CONFIGS: dict[str, dict[str, Any]] = {
    "affine": {"bits": 4},
    "qjl": {"bits": 4},
    "turboquant_prod": {"bits": 4},
    "kivi": {"bits": 4, "kivi_residual_length": 32, "kivi_group_size": 32},
}


def prompt_length(n_q_heads: int) -> int:
    """One query row past the first query block of a process holding n_q_heads (a rank of two
    holding half of them takes the whole prompt as one block)."""
    rows = query_block(1, n_q_heads, 1 << 20, BLOCK)
    assert query_block(1, n_q_heads // 2, rows + 1, BLOCK) == rows + 1  # the rank's split differs
    return rows + 1


def attention(config: KVCacheConfig, q: mx.array, k: mx.array, v: mx.array, prompt: int) -> mx.array:
    """Prefill `prompt` tokens (causal), then decode the rest one token at a time: [B, Hq, S, Dv]."""
    cache = cache_class(config.method)(config, LayerSpec(1, 4))
    cache.block = BLOCK
    cache.update_and_fetch(k[:, :, :prompt], v[:, :, :prompt])
    outs = [cache.attend(q[:, :, :prompt], q.shape[-1] ** -0.5, "causal")]
    for t in range(prompt, q.shape[2]):
        cache.update_and_fetch(k[:, :, t : t + 1], v[:, :, t : t + 1])
        outs.append(cache.attend(q[:, :, t : t + 1], q.shape[-1] ** -0.5, None))
    return mx.concatenate(outs, axis=2)


def inputs(ratio: int, dim: int, length: int) -> tuple[mx.array, mx.array, mx.array]:
    keys = iter(mx.random.split(mx.random.key(ratio * 1000 + dim), 3))
    shape = (1, KV_HEADS, length, dim)
    q = mx.random.normal((1, KV_HEADS * ratio, length, dim), key=next(keys)).astype(mx.float16)
    k = (2 * mx.random.normal(shape, key=next(keys))).astype(mx.float16)  # a spread that exercises the codes
    v = mx.random.normal(shape, key=next(keys)).astype(mx.float16)
    return q, k, v


def assert_halves_match(config: KVCacheConfig, ratio: int, dim: int) -> None:
    n_q = KV_HEADS * ratio
    prompt = prompt_length(n_q)
    q, k, v = inputs(ratio, dim, prompt + DECODE_STEPS)
    full = attention(config, q, k, v, prompt)
    half_q, half_kv = n_q // 2, KV_HEADS // 2
    first = attention(config, q[:, :half_q], k[:, :half_kv], v[:, :half_kv], prompt)
    second = attention(config, q[:, half_q:], k[:, half_kv:], v[:, half_kv:], prompt)
    for name, part, expected in (("first", first, full[:, :half_q]), ("second", second, full[:, half_q:])):
        differ = (part != expected).sum().item()
        assert isinstance(differ, int), differ  # the sum of a bool array is an integer array
        assert differ == 0, f"{name} half: {differ} of {part.size} outputs differ (R={ratio}, D={dim}, L={prompt})"


@pytest.mark.parametrize("dim", [64, 96, 128])
@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8, 16])
def test_affine_half_the_heads_is_half_the_attention(ratio: int, dim: int) -> None:
    group = 32 if dim % 64 else 64  # 96 = 3 x 32
    assert_halves_match(KVCacheConfig("affine", bits=4, affine_group_size=group), ratio, dim)


def test_affine_refuses_head_dim_80_before_any_attention() -> None:
    """80 is a multiple of no affine group size (32, 64, 128): refused when wired, never mis-split."""
    for group in (32, 64, 128):
        with pytest.raises(ValueError, match="head dimension 80"):
            AffineCache.check_head_dims(KVCacheConfig("affine", bits=4, affine_group_size=group), 80, 80)


@pytest.mark.parametrize("method", [m for m in CONFIGS if m != "affine"])
@pytest.mark.parametrize("ratio", [1, 4])
def test_other_packed_quantizers_split_by_heads_exactly(method: str, ratio: int) -> None:
    """qjl, turboquant_prod and kivi read packed codes the same way (per call, not per block)."""
    assert_halves_match(KVCacheConfig(method, **CONFIGS[method]), ratio, 128)
