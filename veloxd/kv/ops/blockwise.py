"""Attention over a stored form in blocks, with an online softmax (FlashAttention-style).

Every veloxd cache attends through `blockwise_attention`, at every step, prefill and decode:
keys are read `block` at a time (the cache decodes or dequantizes only that block), and queries
`query_block(...)` rows at a time, with the partial results evaluated after each key block so
that only one block is alive.

The bound (stated once, checked by tests/kv/test_peak_memory.py): one call holds at most

    transient <= PEAK_FACTOR * (score block + key/value block) + 4 * io

where score block = B * Hq * Lq * block * 4 bytes (float32 scores, Lq = the query block,
Lq * Hq * block <= SCORE_ELEMENTS), key/value block = B * Hkv * block * (D + Dv) * 4 bytes (one
block decoded to float32, the most any method expands it), and io = B * Hq * L * (D + Dv) * 4
(the queries, the output and its accumulators, which scale with the step, not the cache). The
bound does not grow with the cache length. `transient_bound` computes it.

A decode step (one query) reads DECODE_BLOCK = 32 keys per block (`key_block`; KIVI rounds it up
to its key group), a prefill chunk DEFAULT_BLOCK = 1024. Chosen by measurement (benchmarks/kv_peak.py,
one layer at 4k context, GQA 16, d 128, CPU with OpenBLAS; docs/results.md): with 32-key blocks
a decode step's transient is at or under the fp16 cache's own decode peak (0.067x its layer cache)
for affine, KIVI, QJL and the eviction methods (TurboQuant keeps a floor near 0.08x that smaller
blocks do not lower), where 1024-key blocks held 1.2-2.1x; a step costs 0.7-2.7x the time of
1024-key blocks (QJL up to 4.8x; a loaded shared CPU, so ranges), the per-block evaluation being
the price.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import mlx.core as mx

ScoreFn = Callable[[mx.array, int, int], mx.array]
ValueFn = Callable[[mx.array, int, int], mx.array]
# mask(q_start, q_stop, k_start, k_stop) -> bool, broadcastable to [B, Hkv, R, Lq, n] (None: all)
MaskFn = Callable[[int, int, int, int], "mx.array | None"]
CollectFn = Callable[[mx.array, int, int, int, int], None]  # (probs, q_start, q_stop, k_start, k_stop)


class Overlay(Protocol):
    """Exact scores and values for some (query, key) pairs of a block (the recent window)."""

    def scores(self, s: mx.array, q: mx.array, qs: int, qe: int, start: int, stop: int) -> mx.array: ...

    def split(self, p: mx.array, qs: int, qe: int, start: int, stop: int) -> tuple[mx.array, mx.array | None]: ...


DEFAULT_BLOCK = 1024  # keys per block
DECODE_BLOCK = 32  # keys per block of a one-query step (chosen by measurement: see the module doc)
SCORE_ELEMENTS = 1 << 21  # float32 scores alive per block (8 MiB): bounds the query block
PEAK_FACTOR = 6  # scores, their exp, a mask and casts: the temporaries one block step holds


def group_queries(queries: mx.array, n_kv_heads: int) -> mx.array:
    """[B, Hq, L, D] -> [B, Hkv, R, L, D] with R = Hq // Hkv (GQA groups share a KV head)."""
    B, n_q_heads, L, D = queries.shape
    return queries.reshape(B, n_kv_heads, n_q_heads // n_kv_heads, L, D)  # [B, Hkv, R, L, D]


def ungroup(out: mx.array) -> mx.array:
    """[B, Hkv, R, L, Dv] -> [B, Hq, L, Dv]."""
    B, n_kv_heads, R, L, Dv = out.shape
    return out.reshape(B, n_kv_heads * R, L, Dv)  # [B, Hq, L, Dv]


def per_kv_head(x: mx.array, matmul: Callable[[mx.array], mx.array]) -> mx.array:
    """matmul of grouped rows x [B, Hkv, R, L, K] against one KV head's block, as [B, Hkv, R*L, K].

    Folding the R query heads of a group into rows keeps the block's operand at [B, Hkv, n, ..]:
    a broadcast over R makes MLX copy it R times (quantized_matmul ~R x the block's size).
    """
    B, H, R, L, K = x.shape
    out = matmul(x.reshape(B, H, R * L, K))  # [B, Hkv, R*L, N]
    return out.reshape(B, H, R, L, out.shape[-1])


def key_block(L: int, block: int = DEFAULT_BLOCK, align: int = 1) -> int:
    """Keys per block for a step of L queries: a decode step (L == 1) reads DECODE_BLOCK keys at a
    time (see the module doc), rounded down to a multiple of `align` and at least `align` (KIVI
    quantizes keys in token groups and can only cut a block at a group boundary)."""
    if L != 1:
        return block
    small = min(block, DECODE_BLOCK)
    return max(align, small - small % align)


def query_block(batch: int, n_q_heads: int, L: int, block: int = DEFAULT_BLOCK) -> int:
    """Query rows per block so that batch * Hq * rows * block <= SCORE_ELEMENTS (at least 1)."""
    return max(1, min(L, SCORE_ELEMENTS // max(1, batch * n_q_heads * block)))


def transient_bound(
    batch: int,
    n_q_heads: int,
    n_kv_heads: int,
    L: int,
    d: int,
    dv: int,
    block: int = DEFAULT_BLOCK,
    align: int = 1,
) -> int:
    """Bytes one attention call may hold beyond what the cache stores (see the module doc)."""
    block = key_block(L, block, align)
    rows = query_block(batch, n_q_heads, L, block)
    scores = batch * n_q_heads * rows * block * 4
    kv_block = batch * n_kv_heads * block * (d + dv) * 4
    io = batch * n_q_heads * L * (d + dv) * 4
    return PEAK_FACTOR * (scores + kv_block) + 4 * io


def causal_mask(L: int, S: int) -> MaskFn:
    """Queries are the last L of S positions; a key is visible when it is not after the query."""

    def mask(qs: int, qe: int, start: int, stop: int) -> mx.array | None:
        if stop <= S - L + qs + 1:
            return None  # every key of this block is visible to the block's first query
        q_pos = mx.arange(S - L + qs, S - L + qe)[:, None]  # [Lq, 1] absolute query positions
        return q_pos >= mx.arange(start, stop)[None]  # [Lq, n]

    return mask


def array_mask(mask: mx.array) -> MaskFn:
    """An array mask [.., L, S] (bool, or additive: large negative = masked) as a MaskFn."""

    def part(qs: int, qe: int, start: int, stop: int) -> mx.array:
        piece = mask[..., qs:qe, start:stop]
        if piece.ndim == 4:  # [B, 1 or Hq, Lq, n] -> [B, 1 or Hq, 1, Lq, n]
            piece = mx.expand_dims(piece, -3)
        if piece.dtype != mx.bool_:
            piece = piece > mx.finfo(mx.float32).min / 2
        return piece

    return part


def as_mask_fn(mask: Any, L: int, S: int) -> MaskFn | None:
    """None, "causal", an array or a MaskFn -> a MaskFn (None: every key visible)."""
    if mask is None or callable(mask):
        return mask
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unsupported mask '{mask}'")
        return causal_mask(L, S)
    return array_mask(mask)


def blockwise_attention(
    queries: mx.array,
    scale: float,
    n_kv_heads: int,
    length: int,
    score_fn: ScoreFn,
    value_fn: ValueFn | None,
    mask: Any = None,
    block: int = DEFAULT_BLOCK,
    collect: CollectFn | None = None,
    align: int = 1,
    overlay: Overlay | None = None,
) -> mx.array | None:
    """Softmax attention of `queries` [B, Hq, L, D] over `length` stored keys, block by block.

    score_fn(q, start, stop) -> [B, Hkv, R, Lq, n] raw scores of pre-scaled grouped queries
    q [B, Hkv, R, Lq, D] against keys [start, stop); value_fn(p, start, stop) -> [B, Hkv, R, Lq, Dv]
    is p @ values[start:stop]. `mask` is None, "causal" (queries are the last L positions), an
    array [.., L, length] (bool, or additive) or a MaskFn. `collect(probs, qs, qe, start, stop)`,
    when given, receives the normalized weights [B, Hkv, R, Lq, n] (float32) of every block in a
    second pass (eviction policies score tokens with them). `align`: block starts are multiples of
    it (a decode step's smaller block included). `overlay` replaces some scores and weights of a
    block by exact ones (veloxd.kv.quant.window: the recent window). Returns [B, Hq, L, Dv] in the
    queries' dtype, or None when value_fn is None (weights only).
    """
    B, n_q, L, _ = queries.shape
    block = key_block(L, block, align)
    q_all = group_queries(queries * scale, n_kv_heads)  # [B, Hkv, R, L, D]
    mask_fn = as_mask_fn(mask, L, length)
    rows = query_block(B, n_q, L, block)
    causal = isinstance(mask, str)

    def values_of(p: mx.array, start: int, stop: int, qs: int, qe: int) -> mx.array:
        assert value_fn is not None  # called only when values are wanted
        if overlay is None:
            return value_fn(p, start, stop).astype(mx.float32)
        rest, exact = overlay.split(p, qs, qe, start, stop)
        part = value_fn(rest, start, stop).astype(mx.float32)
        return part if exact is None else part + exact.astype(mx.float32)

    outs = []
    for qs in range(0, L, rows):
        qe = min(L, qs + rows)
        horizon = length - L + qe if causal else length  # causal: blocks after it are never visible
        spans = [(start, min(start + block, length)) for start in range(0, horizon, block)]
        q = q_all[:, :, :, qs:qe]  # [B, Hkv, R, Lq, D]

        def scores_of(start: int, stop: int, q: mx.array = q, qs: int = qs, qe: int = qe) -> tuple[mx.array, Any]:
            s = score_fn(q, start, stop)
            if overlay is not None:
                s = overlay.scores(s, q, qs, qe, start, stop)
            s = s.astype(mx.float32)  # [B, Hkv, R, Lq, n]
            keep = None if mask_fn is None else mask_fn(qs, qe, start, stop)
            return (s if keep is None else mx.where(keep, s, -mx.inf)), keep

        running_max = denom = acc = None
        for start, stop in spans:
            s, _ = scores_of(start, stop)
            block_max = s.max(axis=-1, keepdims=True)  # [B, Hkv, R, Lq, 1]
            new_max = block_max if running_max is None else mx.maximum(running_max, block_max)
            safe_max = mx.where(mx.isinf(new_max), 0.0, new_max)  # fully masked rows stay at 0
            p = mx.exp(s - safe_max)
            part = None if value_fn is None else values_of(p.astype(queries.dtype), start, stop, qs, qe)
            if running_max is None or denom is None:  # the first block (it sets both)
                denom, acc = p.sum(axis=-1, keepdims=True), part
            else:
                correction = mx.exp(running_max - safe_max)
                denom = denom * correction + p.sum(axis=-1, keepdims=True)
                if part is not None:
                    assert acc is not None  # value_fn gave the first block's part too
                    acc = acc * correction + part
            running_max = new_max
            mx.eval(*(a for a in (running_max, denom, acc) if a is not None))  # one block alive at a time
        if collect is not None and spans:
            assert running_max is not None and denom is not None  # spans is not empty: the loop set them
            safe_max = mx.where(mx.isinf(running_max), 0.0, running_max)
            inv = 1.0 / mx.maximum(denom, 1e-30)
            for start, stop in spans:
                s, keep = scores_of(start, stop)
                probs = mx.exp(s - safe_max) * inv
                collect(probs if keep is None else mx.where(keep, probs, 0.0), qs, qe, start, stop)
        if value_fn is not None:
            if acc is None or denom is None:  # nothing stored (no span): attention over no key is zero
                raise ValueError("attention over an empty cache")
            outs.append(ungroup(acc / mx.maximum(denom, 1e-30)).astype(queries.dtype))
            if len(outs) > 1 or qe < L:
                mx.eval(outs[-1])
    if value_fn is None:
        return None
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)


def dense_reference(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
    """Plain attention over dense keys/values [B, Hkv, S, D], for tests and fp reference paths."""
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
