"""Attention over stored keys in blocks with an online softmax (FlashAttention-style).

Compressed caches score and weight their own stored form block by block, so the score matrix
held at once is [B, Hkv, R, L, block] rather than [.., L, S]: prefill peak memory is bounded by
the block, not by the prompt length (the stock quantized attention materializes all of it).
Decode (L == 1) runs as a single block: its scores are small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

ScoreFn = Callable[[mx.array, int, int], mx.array]
ValueFn = Callable[[mx.array, int, int], mx.array]

DEFAULT_BLOCK = 1024


def group_queries(queries: mx.array, n_kv_heads: int) -> mx.array:
    """[B, Hq, L, D] -> [B, Hkv, R, L, D] with R = Hq // Hkv (GQA groups share a KV head)."""
    B, n_q_heads, L, D = queries.shape
    return queries.reshape(B, n_kv_heads, n_q_heads // n_kv_heads, L, D)  # [B, Hkv, R, L, D]


def ungroup(out: mx.array) -> mx.array:
    """[B, Hkv, R, L, Dv] -> [B, Hq, L, Dv]."""
    B, n_kv_heads, R, L, Dv = out.shape
    return out.reshape(B, n_kv_heads * R, L, Dv)  # [B, Hq, L, Dv]


def block_mask(mask: Any, L: int, S: int, start: int, stop: int) -> mx.array | None:
    """The part of `mask` for keys [start, stop), as a bool array broadcastable to [B, Hkv, R, L, n]."""
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unsupported mask '{mask}'")
        if stop <= S - L + 1:
            return None  # every key of this block is visible to the first query
        q_pos = mx.arange(S - L, S)[:, None]  # [L, 1] absolute positions of the queries
        k_pos = mx.arange(start, stop)[None]  # [1, n]
        return q_pos >= k_pos  # [L, n]
    part = mask[..., start:stop]
    if part.ndim == 4:  # [B, 1 or Hq, L, n] -> [B, 1 or Hq, 1, L, n]
        part = mx.expand_dims(part, -3)
    if part.dtype != mx.bool_:
        part = part > mx.finfo(mx.float32).min / 2  # additive masks: -inf / large negative = masked
    return part


def blockwise_attention(
    queries: mx.array,
    scale: float,
    n_kv_heads: int,
    length: int,
    score_fn: ScoreFn,
    value_fn: ValueFn,
    mask: Any = None,
    block: int = DEFAULT_BLOCK,
) -> mx.array:
    """Softmax attention of `queries` [B, Hq, L, D] over `length` stored keys.

    score_fn(q, start, stop) -> [B, Hkv, R, L, n] raw scores of pre-scaled grouped queries
    q [B, Hkv, R, L, D] against keys [start, stop); value_fn(p, start, stop) -> [B, Hkv, R, L, Dv]
    is p @ values[start:stop]. `mask` is None, "causal" (queries are the last L positions) or an
    array [.., L, length] (bool, or additive). Returns [B, Hq, L, Dv] in the queries' dtype.
    """
    L = queries.shape[2]
    q = group_queries(queries * scale, n_kv_heads)  # [B, Hkv, R, L, D]
    if L == 1 or length <= block:
        scores = score_fn(q, 0, length).astype(mx.float32)  # [B, Hkv, R, L, S]
        keep = block_mask(mask, L, length, 0, length)
        if keep is not None:
            scores = mx.where(keep, scores, -mx.inf)
        probs = mx.softmax(scores, axis=-1)
        if keep is not None:
            probs = mx.where(keep, probs, 0.0)  # a row with every key masked is NaN: make it 0
        out = value_fn(probs.astype(queries.dtype), 0, length)
        return ungroup(out).astype(queries.dtype)

    running_max = None
    denom = None
    acc = None
    for start in range(0, length, block):
        stop = min(start + block, length)
        scores = score_fn(q, start, stop).astype(mx.float32)  # [B, Hkv, R, L, n]
        keep = block_mask(mask, L, length, start, stop)
        if keep is not None:
            scores = mx.where(keep, scores, -mx.inf)
        block_max = scores.max(axis=-1, keepdims=True)  # [B, Hkv, R, L, 1]
        new_max = block_max if running_max is None else mx.maximum(running_max, block_max)
        safe_max = mx.where(mx.isinf(new_max), 0.0, new_max)  # fully masked rows stay at 0
        probs = mx.exp(scores - safe_max)
        part = value_fn(probs.astype(queries.dtype), start, stop).astype(mx.float32)
        if acc is None or denom is None or running_max is None:  # the first block (all three set together)
            denom, acc = probs.sum(axis=-1, keepdims=True), part
        else:
            correction = mx.exp(running_max - safe_max)
            denom = denom * correction + probs.sum(axis=-1, keepdims=True)
            acc = acc * correction + part
        running_max = new_max
        mx.eval(running_max, denom, acc)  # bound the graph: one block live at a time
    assert acc is not None and denom is not None  # length > block: the loop ran
    out = acc / mx.maximum(denom, 1e-30)
    return ungroup(out).astype(queries.dtype)


def dense_reference(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
    """Plain attention over dense keys/values [B, Hkv, S, D], for tests and fp reference paths."""
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
