"""Attention over an eviction cache's slots: visibility from absolute positions, weights on demand.

Eviction caches keep tokens in arbitrary slots, so the causal mask mlx_lm passes (built from one
layer's length) does not describe them; visibility is recomputed from each slot's absolute
position, one key block at a time. Attention runs through `veloxd.kv.ops.blockwise` like every
other method, so one call's transient memory is bounded by a block (its module doc states the
bound), not by the retained tokens. Methods that score tokens by attention (TOVA, H2O, SnapKV)
get the softmax weights from the same pass, reduced block by block (`received`), never as a
whole [.., L, S] matrix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, overload

import mlx.core as mx

from veloxd.kv.ops.blockwise import DEFAULT_BLOCK, MaskFn, blockwise_attention, one_span_block, per_kv_head

WindowRule = Callable[[mx.array, mx.array], mx.array]


class PackedKeys(Protocol):
    """Keys of the slots held in a packed form (veloxd.kv.evict.packed), scored one block at a time."""

    @property
    def shape(self) -> tuple[int, int, int]:  # (B, Hkv, slots): what attention reads of dense keys
        ...

    def scores(self, q: mx.array, start: int, stop: int) -> mx.array:
        """q [B, Hkv, R, Lq, D] pre-scaled -> raw scores [B, Hkv, R, Lq, n] against slots [start, stop)."""
        ...


class PackedValues(Protocol):
    """Values of the slots held in a packed form, read one block at a time."""

    def weighted(self, p: mx.array, start: int, stop: int) -> mx.array:
        """p [B, Hkv, R, Lq, n] -> p @ values of slots [start, stop): [B, Hkv, R, Lq, Dv]."""
        ...


Keys = mx.array | PackedKeys  # dense slots [B, Hkv, S, D], or their packed form
Values = mx.array | PackedValues
# probs [B, Hkv, R, Lq, n] (float32), q_start, q_stop -> weight received per key [..., n]
Reduce = Callable[[mx.array, int, int], mx.array]


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


def slot_mask(kpos: mx.array, qpos: mx.array, window: WindowRule | None = None, own: int | None = None) -> MaskFn:
    """Visibility of slots kpos [B, Hm, S] to queries qpos [B, L], built one block at a time.

    `own`: slot of query 0 (queries sit in consecutive slots); each query then also sees its own
    slot, so a padding query's softmax row is never empty.
    """

    def part(qs: int, qe: int, start: int, stop: int) -> mx.array:
        vis = visible(kpos[..., start:stop], qpos[:, qs:qe], window)  # [B, Hm, Lq, n]
        if own is not None:
            mine = mx.arange(start, stop)[None] == (mx.arange(qs, qe) + own)[:, None]  # [Lq, n]
            vis = vis | mine
        return mx.expand_dims(vis, 2)  # [B, Hm, 1, Lq, n]

    return part


def _score_fn(keys: Keys) -> Callable[[mx.array, int, int], mx.array]:
    if not isinstance(keys, mx.array):
        return keys.scores

    def scores(q: mx.array, start: int, stop: int) -> mx.array:
        k_t = keys[:, :, start:stop].swapaxes(-1, -2).astype(q.dtype)  # [B, Hkv, D, n]
        return per_kv_head(q, lambda rows: rows @ k_t)  # [B, Hkv, R, Lq, n]

    return scores


def _value_fn(values: Values) -> Callable[[mx.array, int, int], mx.array]:
    if not isinstance(values, mx.array):
        return values.weighted

    def weighted(p: mx.array, start: int, stop: int) -> mx.array:
        v = values[:, :, start:stop].astype(p.dtype)  # [B, Hkv, n, Dv]
        return per_kv_head(p, lambda rows: rows @ v)  # [B, Hkv, R, Lq, Dv]

    return weighted


def key_block(queries: mx.array, keys: Keys, block: int, one_span: bool) -> int:
    """Keys per attention block: dense slots (fp16 keys, a block is a view) in one span when the
    score bound allows (veloxd.kv.ops.blockwise.one_span_block); packed slots `block` at a time,
    which bounds their decoded copy."""
    if one_span and isinstance(keys, mx.array):
        B, n_q, L, _ = queries.shape
        return one_span_block(B, n_q, L, keys.shape[2], block)
    return block


def attend(
    queries: mx.array,
    keys: Keys,
    values: Values,
    scale: float,
    mask: str | MaskFn | None,
    block: int = DEFAULT_BLOCK,
    one_span: bool = True,
    decode_block: int | None = None,
) -> mx.array:
    """Attention [B, Hq, L, Dv] of queries [B, Hq, L, D] over slots keys/values [B, Hkv, S, D] (or packed).
    `one_span`: see `key_block` (False: `block` keys at a time whatever the keys); `decode_block`:
    see veloxd.kv.ops.blockwise.key_block."""
    block = key_block(queries, keys, block, one_span)
    out = blockwise_attention(
        queries,
        scale,
        keys.shape[1],
        keys.shape[2],
        _score_fn(keys),
        _value_fn(values),
        mask,
        block=block,
        decode_block=decode_block,
    )
    assert out is not None  # values were given
    return out


# With values, the attention output comes back too; with None, only the weights (out is None).
@overload
def received(
    queries: mx.array,
    keys: Keys,
    values: Values,
    scale: float,
    mask: str | MaskFn | None,
    reduce: Reduce,
    block: int = ...,
    one_span: bool = ...,
    decode_block: int | None = ...,
) -> tuple[mx.array, mx.array]: ...
@overload
def received(
    queries: mx.array,
    keys: Keys,
    values: None,
    scale: float,
    mask: str | MaskFn | None,
    reduce: Reduce,
    block: int = ...,
    one_span: bool = ...,
    decode_block: int | None = ...,
) -> tuple[None, mx.array]: ...
def received(
    queries: mx.array,
    keys: Keys,
    values: Values | None,
    scale: float,
    mask: str | MaskFn | None,
    reduce: Reduce,
    block: int = DEFAULT_BLOCK,
    one_span: bool = True,
    decode_block: int | None = None,
) -> tuple[mx.array | None, mx.array]:
    """(attention output or None without values, weight each slot received [..., S]).

    `reduce` turns one block's weights into the weight per key of that block; blocks of queries
    are summed, blocks of keys concatenated. Nothing of size L x S is ever held. `one_span`: see
    `key_block`; `decode_block`: see veloxd.kv.ops.blockwise.key_block.
    """
    per_block: dict[int, mx.array] = {}

    def collect(probs: mx.array, qs: int, qe: int, start: int, stop: int) -> None:
        part = reduce(probs, qs, qe)
        per_block[start] = part if start not in per_block else per_block[start] + part
        mx.eval(per_block[start])

    value_fn = None if values is None else _value_fn(values)
    block = key_block(queries, keys, block, one_span)
    out = blockwise_attention(
        queries,
        scale,
        keys.shape[1],
        keys.shape[2],
        _score_fn(keys),
        value_fn,
        mask,
        block=block,
        collect=collect,
        decode_block=decode_block,
    )
    mass = mx.concatenate([per_block[s] for s in sorted(per_block)], axis=-1)
    return out, mass


def max_pool(scores: mx.array, kernel: int) -> mx.array:
    """1-D max pooling along the last axis, stride 1, same length (scores are >= 0: zero padding)."""
    if kernel <= 1:
        return scores
    n = scores.shape[-1]
    half = kernel // 2
    padded = mx.pad(scores, [(0, 0)] * (scores.ndim - 1) + [(half, half)])
    return functools.reduce(mx.maximum, (padded[..., i : i + n] for i in range(kernel)))
