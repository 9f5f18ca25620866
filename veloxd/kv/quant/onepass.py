"""A decode step over a per-token store in one pass: codes and the recent window merged by log-sum-exp.

Why a path of its own: the general block loop (veloxd.kv.ops.blockwise) reads the window as an
overlay, splicing exact scores into the codes' scores and splitting the weights back out: three
concatenations and a pad over all T stored tokens per step. Here the codes' scores over the whole
buffer are masked once (spare slots past `length`, positions the window reads exactly, and the
caller's mask) and the window's W exact scores are a second, separate softmax part; the two
parts share one running maximum and one denominator (the online-softmax combine, Milakov and
Gimelshein, 2018, arXiv 1805.02867), so nothing over T is copied and no dequantized key or value
ever exists. The result equals the block loop's up to float rounding (tests/kv/test_decode_window.py).

Transient (the bound in veloxd.kv.ops.blockwise, decode): the scores and their weights,
B * Hq * capacity floats, a [B, capacity] keep mask, and the window's B * Hq * W scores.
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx

from veloxd.kv.ops import packing
from veloxd.kv.ops.blockwise import MaskFn, group_queries, ungroup
from veloxd.kv.quant.window import WindowRead

Store = dict[str, mx.array]


class Codec(Protocol):
    """What a decode step needs of a TokenCodec (veloxd.kv.quant.tokencache)."""

    def rotate_queries(self, q: mx.array) -> mx.array: ...

    def scores(self, q: mx.array, store: Store) -> mx.array: ...

    def weighted_values(self, p: mx.array, store: Store) -> mx.array: ...


def codes_keep(
    length: int, cap: int, mask_fn: MaskFn | None, exact_from: int, exact_read: mx.array | None
) -> mx.array | None:
    """Which buffer slots [B or 1, 1, 1, 1, cap] the codes answer for (None: all of them).

    A slot is read from the codes when it is stored (< length), visible under the mask, and not
    read exactly from the window (exact_read [B, 1, 1, 1, m] covers slots exact_from..length)."""
    keep = None if mask_fn is None else mask_fn(0, 1, 0, length)  # [.., 1, length] bool or None
    if exact_read is not None:
        not_exact = mx.logical_not(exact_read)  # [B, 1, 1, 1, m]
        own = mx.pad(
            not_exact, [(0, 0)] * (not_exact.ndim - 1) + [(exact_from, 0)], constant_values=mx.array(True)
        )  # [B, 1, 1, 1, length]
        keep = own if keep is None else keep & own
    if keep is None:
        if cap == length:
            return None
        keep = mx.ones((1, 1, 1, 1, length), mx.bool_)
    if cap > length:  # the spare slots past `length` hold zeros or trimmed codes: never read
        keep = mx.pad(keep, [(0, 0)] * (keep.ndim - 1) + [(0, cap - length)])  # [.., cap]
    return keep


def decode_step(
    codec: Codec,
    store: Store,
    length: int,
    queries: mx.array,
    scale: float,
    mask_fn: MaskFn | None,
    window: WindowRead | None,
) -> mx.array:
    """Attention of one query per row, queries [B, Hq, 1, D], over the `length` stored tokens.

    The codec's scores and weighted values read the whole buffer (capacity slots); returns
    [B, Hq, 1, Dv] in the queries' dtype, before the codec's `finish`."""
    n_kv_heads = next(iter(store.values())).shape[1]
    cap = packing.capacity(store)
    q = group_queries(codec.rotate_queries(queries) * scale, n_kv_heads)  # [B, Hkv, R, 1, D]
    s = codec.scores(q, store).astype(mx.float32)  # [B, Hkv, R, 1, cap]
    exact = None if window is None else window.decode_part(q)
    exact_from, exact_read = length, None
    if exact is not None:
        exact_from, exact_s, exact_v, exact_read = exact  # [B, Hkv, R, 1, m], [B, Hkv, 1, m, Dv], [B, 1, 1, 1, m]
        visible = None if mask_fn is None else mask_fn(0, 1, exact_from, length)
        if visible is not None:
            exact_s = mx.where(visible, exact_s, -mx.inf)
    keep = codes_keep(length, cap, mask_fn, exact_from, exact_read)
    if keep is not None:
        s = mx.where(keep, s, -mx.inf)
    top = s.max(axis=-1, keepdims=True)  # [B, Hkv, R, 1, 1]
    if exact is not None:
        top = mx.maximum(top, exact_s.max(axis=-1, keepdims=True))
    top = mx.where(mx.isinf(top), 0.0, top)  # a row with nothing visible stays at zero
    p = mx.exp(s - top)  # [B, Hkv, R, 1, cap]: zero on every slot the codes do not answer for
    denom = p.sum(axis=-1, keepdims=True)
    out = codec.weighted_values(p.astype(queries.dtype), store).astype(mx.float32)
    if exact is not None:
        p_exact = mx.exp(exact_s - top)  # [B, Hkv, R, 1, m]
        denom = denom + p_exact.sum(axis=-1, keepdims=True)
        out = out + (p_exact @ exact_v.astype(mx.float32))  # [B, Hkv, R, 1, Dv]
    return ungroup(out / mx.maximum(denom, 1e-30)).astype(queries.dtype)  # [B, Hq, 1, Dv]
