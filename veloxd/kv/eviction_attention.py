"""Attention over an eviction cache's slots: visibility from absolute positions, weights on demand.

Eviction caches keep tokens in arbitrary slots, so the causal mask mlx_lm passes (built from one
layer's length) does not describe them; visibility is recomputed from each slot's absolute
position instead. Methods that score tokens by attention (TOVA, H2O, SnapKV) need the softmax
weights, which MLX's fused kernel does not return: `weighted` computes them explicitly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import mlx.core as mx

# Largest score block held at once by `column_mass` (elements of [B, Hq, Lb, S], float32).
MASS_BLOCK_ELEMENTS = 1 << 24

WindowRule = Callable[[mx.array, mx.array], mx.array]


def visible(kpos: mx.array, qpos: mx.array, window: WindowRule | None = None) -> mx.array:
    """Slot positions kpos [B, Hm, S] and query positions qpos [B, n] -> bool [B, Hm, n, S].

    A key is visible when its position is not after the query's; free slots hold a position
    larger than any query's, so they are never visible.
    """
    k = kpos[:, :, None, :]  # [B, Hm, 1, S]
    q = qpos[:, None, :, None]  # [B, 1, n, 1]
    vis = k <= q
    if window is not None:
        vis = vis & window(k, q)
    return vis


def fused(queries: mx.array, keys: mx.array, values: mx.array, scale: float, vis: str | mx.array | None) -> mx.array:
    """MLX's fused attention; `vis` is None, "causal" or bool [B, 1 | Hkv, L, S]. Returns [B, Hq, L, Dv]."""
    if isinstance(vis, mx.array):
        n_rep = queries.shape[1] // keys.shape[1]
        if vis.shape[1] > 1 and n_rep > 1:
            vis = mx.repeat(vis, n_rep, axis=1)  # [B, Hq, L, S]: query head h reads KV head h // n_rep
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=vis)


def weights(queries: mx.array, keys: mx.array, scale: float, vis: mx.array | None) -> mx.array:
    """Softmax weights [B, Hkv, R, L, S] (float32) of queries [B, Hq, L, D] over keys [B, Hkv, S, D].

    `vis` is bool [B, 1 | Hkv, L, S], or None (every key visible). A query that sees nothing gets
    all-zero weights, not NaN.
    """
    B, n_q, L, D = queries.shape
    n_kv = keys.shape[1]
    q = (queries * scale).reshape(B, n_kv, n_q // n_kv, L, D)  # [B, Hkv, R, L, D]
    scores = (q @ mx.expand_dims(keys, 2).swapaxes(-1, -2)).astype(mx.float32)  # [B, Hkv, R, L, S]
    if vis is None:
        return mx.softmax(scores, axis=-1)
    vis5 = mx.expand_dims(vis, 2)  # [B, 1 | Hkv, 1, L, S]
    probs = mx.softmax(mx.where(vis5, scores, -mx.inf), axis=-1)
    return mx.where(vis5, probs, 0.0)


def weighted(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, vis: mx.array | None
) -> tuple[mx.array, mx.array]:
    """Explicit attention: (output [B, Hq, L, Dv], weights [B, Hkv, R, L, S] float32)."""
    B, n_q, L, _ = queries.shape
    probs = weights(queries, keys, scale, vis)
    out = probs.astype(values.dtype) @ mx.expand_dims(values, 2)  # [B, Hkv, R, L, Dv]
    return out.reshape(B, n_q, L, -1), probs  # [B, Hq, L, Dv]


def column_mass(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    vis: mx.array | None,
    query_weight: mx.array,
    max_elements: int = MASS_BLOCK_ELEMENTS,
) -> tuple[mx.array, mx.array]:
    """Attention output [B, Hq, L, Dv] and the weight each key received [B, Hkv, S].

    The received weight is summed over the GQA group and over the queries, each query scaled by
    query_weight [B, L] (0 for padding). Queries run in blocks so that at most `max_elements`
    weights are alive at once: prefill memory is bounded by the block, not by L x S.
    """
    _, n_q, L, _ = queries.shape
    S = keys.shape[2]
    block = max(1, max_elements // max(1, n_q * S))
    outs: list[mx.array] = []
    mass = None
    for start in range(0, L, block):
        stop = min(L, start + block)
        part_vis = None if vis is None else vis[:, :, start:stop]
        out, probs = weighted(queries[:, :, start:stop], keys, values, scale, part_vis)
        w = query_weight[:, None, None, start:stop, None]  # [B, 1, 1, Lb, 1]
        part = (probs * w).sum(axis=(2, 3))  # [B, Hkv, S]
        mass = part if mass is None else mass + part
        outs.append(out)
        if stop < L:
            mx.eval(out, mass)  # one block of weights alive at a time
    assert mass is not None  # a step has at least one query
    return mx.concatenate(outs, axis=2), mass


def max_pool(scores: mx.array, kernel: int) -> mx.array:
    """1-D max pooling along the last axis, stride 1, same length (scores are >= 0: zero padding)."""
    if kernel <= 1:
        return scores
    n = scores.shape[-1]
    half = kernel // 2
    padded = mx.pad(scores, [(0, 0)] * (scores.ndim - 1) + [(half, half)])
    return functools.reduce(mx.maximum, (padded[..., i : i + n] for i in range(kernel)))
