"""Attention over a stored form: a decode step in one pass, a prefill chunk in blocks (online softmax).

Every veloxd cache attends through `blockwise_attention`, except the decode step of a per-token
codec (affine, TurboQuant, QJL): veloxd.kv.quant.onepass reads it in the same single pass, with
the recent window as a second softmax part instead of an overlay spliced into every score.

A decode step (one query per row) reads the whole stored form in ONE pass with a constant number
of MLX operations, whatever the context length: the codec's score and value functions are called
once over all stored tokens and read the packed form directly (quantized_matmul against codes,
scales and biases; a plain matmul against fp16 slots), and nothing is evaluated inside the call,
so mlx_lm's lazy graph of the whole step stays one graph. No block loop is needed: the one thing
that grows with the context is the scores, B * Hq * 1 * T floats, the same as any attention holds.

A prefill chunk (L > 1 queries) reads keys `block` at a time and queries `query_block(...)` rows
at a time, evaluating the partial results after each key block, so that only one block's scores
and one block's decoded keys are alive.

The bound (stated once, checked by tests/kv/test_peak_memory.py): one call holds at most

    prefill: transient <= PEAK_FACTOR * (score block + key/value block) + 4 * io
    decode:  transient <= PEAK_FACTOR * (scores + metadata + exact tokens) + 4 * io

where score block = B * Hq * Lq * block * 4 bytes (float32 scores, Lq = the query block,
Lq * Hq * block <= SCORE_ELEMENTS), key/value block = B * Hkv * block * (D + Dv) * 4 bytes (one
block decoded to float32, the most any method expands it), io = B * Hq * L * (D + Dv) * 4 (the
queries, the output and its accumulators). For a decode step, scores = B * Hq * T * 4 (T stored
tokens); metadata = B * Hkv * T * META_FLOATS * 4, the per-token metadata read as floats (norms,
gains, scales and biases broadcast from constants: at most META_FLOATS per token and KV head,
where a dequantized copy would hold D + Dv); exact tokens = B * Hkv * E * (D + Dv) * 4, the
full-precision tokens a method keeps beside its codes (KIVI's residual, the recent window: E is
set by the configuration, not by the context). A prefill chunk whose weights an eviction policy
collects over several key blocks may also keep one query block's exponentials over all keys
(`kept_weight_rows`: at most SCORE_ELEMENTS floats) instead of a second pass over the blocks;
`transient_bound(..., weights=True)` counts them. The prefill bound does not grow with the cache; the
decode bound grows with it by the scores and the metadata only, never by a decoded copy of the
keys or values. `transient_bound` computes both. A codec that must decode before multiplying
(Lloyd-Max TurboQuant) reads a decode step in blocks of its `decode_block` keys instead, bounded
as a prefill chunk is.
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


DEFAULT_BLOCK = 1024  # keys per block of a prefill chunk
SCORE_ELEMENTS = 1 << 21  # float32 scores alive per block (8 MiB): bounds the query block
PEAK_FACTOR = 6  # scores, their exp, a mask and casts: the temporaries one block step holds
MIN_SPAN_ROWS = 32  # query rows per block under which one span over all dense keys stops paying
META_FLOATS = 16  # per-token metadata floats a decode step may hold per KV head (see the module doc)


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


def key_block(L: int, length: int, block: int = DEFAULT_BLOCK, decode_block: int | None = None) -> int:
    """Keys per block for a step of L queries over `length` stored keys: a decode step (L == 1)
    reads them all in one pass (see the module doc) unless its codec asks for `decode_block`
    keys at a time (Lloyd-Max codes, which must be decoded before a matmul); a prefill chunk
    `block` at a time."""
    if L != 1:
        return block
    return max(1, length) if decode_block is None else decode_block


def query_block(batch: int, n_q_heads: int, L: int, block: int = DEFAULT_BLOCK) -> int:
    """Query rows per block so that batch * Hq * rows * block <= SCORE_ELEMENTS (at least 1)."""
    return max(1, min(L, SCORE_ELEMENTS // max(1, batch * n_q_heads * block)))


def one_span_block(batch: int, n_q_heads: int, L: int, length: int, block: int = DEFAULT_BLOCK) -> int:
    """Keys per block for keys held dense (a block is a view of them, never a decoded copy): all
    `length` in one span when the score bound still lets MIN_SPAN_ROWS query rows (or all L)
    through per block, else `block`. One span needs no online-softmax correction, and the
    weights `collect` wants come from the same pass instead of a second pass over every block
    (H2O's 512-token prefill chunk over 1,536 slots: 1.6x fp16's time in two spans, see
    docs/results.md)."""
    if query_block(batch, n_q_heads, L, max(1, length)) >= min(L, MIN_SPAN_ROWS):
        return max(block, length)
    return block


def kept_weight_rows(batch: int, n_q_heads: int, L: int, length: int, block: int = DEFAULT_BLOCK) -> int | None:
    """Query rows per block of a prefill chunk whose weights are wanted (`collect`) over more than
    one key block: as many rows as have their scores over all `length` keys within the score
    bound, so that each block's exponentials are kept for the weights instead of computed again
    in a second pass (exp is the costliest step of a block on CPU: ~13 ns per score, a 4-bit
    dequantized block's matmul ~2). None (two passes) for one block, or when fewer than
    MIN_SPAN_ROWS rows (or all L) would fit."""
    if L == 1 or length <= block:
        return None
    rows = query_block(batch, n_q_heads, L, length)
    return rows if rows >= min(L, MIN_SPAN_ROWS) else None


def transient_bound(
    batch: int,
    n_q_heads: int,
    n_kv_heads: int,
    L: int,
    d: int,
    dv: int,
    block: int = DEFAULT_BLOCK,
    length: int = 0,
    decode_block: int | None = None,
    exact: int = 0,
    weights: bool = False,
) -> int:
    """Bytes one attention call of L queries over `length` stored keys may hold beyond what the
    cache stores (see the module doc; a decode step read in `decode_block` blocks is bounded as
    a prefill chunk's blocks are). `exact`: full-precision tokens the method keeps beside codes.
    `weights`: the call collects its weights, and a prefill chunk may keep one query block's
    exponentials over all keys (`kept_weight_rows`; at most SCORE_ELEMENTS floats)."""
    io = batch * n_q_heads * L * (d + dv) * 4
    if L == 1 and decode_block is None:
        scores = batch * n_q_heads * max(1, length) * 4
        metadata = batch * n_kv_heads * max(1, length) * META_FLOATS * 4
        exact_tokens = batch * n_kv_heads * exact * (d + dv) * 4
        return PEAK_FACTOR * (scores + metadata + exact_tokens) + 4 * io
    block = key_block(L, length, block, decode_block)
    rows = query_block(batch, n_q_heads, L, block)
    scores = batch * n_q_heads * rows * block * 4
    kept = kept_weight_rows(batch, n_q_heads, L, length, block) if weights else None
    if kept is not None:  # a query block's exponentials over every key, kept for its weights
        scores += batch * n_q_heads * kept * length * 4
    kv_block = batch * n_kv_heads * block * (d + dv) * 4
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
    overlay: Overlay | None = None,
    decode_block: int | None = None,
) -> mx.array | None:
    """Softmax attention of `queries` [B, Hq, L, D] over `length` stored keys, block by block.

    Long: the online softmax (running max, sum and output) and its bookkeeping stay in one
    place, where the transient bound in the module doc can be read off.

    score_fn(q, start, stop) -> [B, Hkv, R, Lq, n] raw scores of pre-scaled grouped queries
    q [B, Hkv, R, Lq, D] against keys [start, stop); value_fn(p, start, stop) -> [B, Hkv, R, Lq, Dv]
    is p @ values[start:stop]. `mask` is None, "causal" (queries are the last L positions), an
    array [.., L, length] (bool, or additive) or a MaskFn. `collect(probs, qs, qe, start, stop)`,
    when given, receives the normalized weights [B, Hkv, R, Lq, n] (float32) of every block
    (eviction policies score tokens with them): from the pass's own exponentials, rescaled once
    the softmax sums are known, when a query block's fit the score bound (`kept_weight_rows`),
    else from a second pass; in a decode step it is called once with the single pass's.
    `overlay` replaces some scores and weights of a block by exact ones (veloxd.kv.quant.window:
    the recent window). `decode_block`: see `key_block`. Returns [B, Hq, L, Dv] in the queries'
    dtype, or None when value_fn is None (weights only).
    """
    B, n_q, L, _ = queries.shape
    block = key_block(L, length, block, decode_block)
    q_all = group_queries(queries * scale, n_kv_heads)  # [B, Hkv, R, L, D]
    mask_fn = as_mask_fn(mask, L, length)
    kept_rows = None if collect is None else kept_weight_rows(B, n_q, L, length, block)
    rows = kept_rows or query_block(B, n_q, L, block)
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
        kept: list[tuple[mx.array, mx.array]] = []  # (exponentials, the max they were taken against)
        for start, stop in spans:
            s, _ = scores_of(start, stop)
            block_max = s.max(axis=-1, keepdims=True)  # [B, Hkv, R, Lq, 1]
            new_max = block_max if running_max is None else mx.maximum(running_max, block_max)
            safe_max = mx.where(mx.isinf(new_max), 0.0, new_max)  # fully masked rows stay at 0
            p = mx.exp(s - safe_max)
            if kept_rows is not None:
                kept.append((p, safe_max))
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
            if len(spans) > 1:  # prefill: one block alive at a time; decode: one lazy pass
                mx.eval(*(a for a in (running_max, denom, acc) if a is not None))
        if collect is not None and spans:
            assert running_max is not None and denom is not None  # spans is not empty: the loop set them
            safe_max = mx.where(mx.isinf(running_max), 0.0, running_max)
            inv = 1.0 / mx.maximum(denom, 1e-30)
            if len(spans) == 1:  # one pass: its weights are final (masked keys have exp(-inf) = 0)
                collect(p * inv, qs, qe, *spans[0])
            elif kept:  # each block's exponentials, brought to the final max (masked keys are 0)
                for (start, stop), (p_block, max_then) in zip(spans, kept, strict=True):
                    collect(p_block * (mx.exp(max_then - safe_max) * inv), qs, qe, start, stop)
            else:
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
