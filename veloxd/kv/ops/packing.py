"""Token-axis helpers for packed stores: dicts of arrays [B, Hkv, T, ...] with tokens at axis 2.

Growth in fixed steps, copies that own their memory (an MLX slice keeps its parent buffer
alive, so anything kept after trimming, filtering or extracting goes through `owned`),
padding and per-row rolls along the token axis. Method-independent by construction.
"""

from __future__ import annotations

import mlx.core as mx

Store = dict[str, mx.array]
TOKEN_AXIS = 2
# Tokens added at a time when a store outgrows its buffer, in every veloxd store (packed codes,
# eviction slots, KIVI's quantized groups) as in mlx_lm's KVCache (`KVCache.step`, a contract test
# checks): the footprint's two-length fit (veloxd.kv.footprint) is exact only while all grow alike.
# A multiple of every kivi_group_size, so KIVI's quantized part grows in whole groups.
CAPACITY_STEP = 256


def round_up(n: int, step: int) -> int:
    return (n + step - 1) // step * step


def owned(x: mx.array) -> mx.array:
    """A copy with its own buffer (never a view pinning a larger parent)."""
    return mx.contiguous(x)


def tokens(x: mx.array, start: int, stop: int) -> mx.array:
    """View of tokens [start, stop) of x [B, H, T, ...]."""
    return x[:, :, start:stop]


def view(store: Store, start: int, stop: int) -> Store:
    return {name: tokens(a, start, stop) for name, a in store.items()}


def owned_view(store: Store, start: int, stop: int, rows: slice | mx.array | None = None) -> Store:
    """Owned copies of tokens [start, stop) (of the given batch rows)."""
    out = {}
    for name, a in store.items():
        if rows is not None:
            a = a[rows]
        out[name] = owned(tokens(a, start, stop))
    return out


def capacity(store: Store | None) -> int:
    if not store:
        return 0
    return next(iter(store.values())).shape[TOKEN_AXIS]


def zeros_for(template: mx.array, batch: int, n_tokens: int) -> mx.array:
    """Zeros shaped like `template` [B, H, T, ...] with another batch size and token count."""
    return mx.zeros((batch, template.shape[1], n_tokens, *template.shape[3:]), dtype=template.dtype)


def ensure_capacity(store: Store | None, new: Store, used: int, needed: int, step: int) -> Store:
    """A store with room for `needed` tokens whose first `used` tokens are those of `store`.

    Grows in `step`-token steps (like mlx_lm's KVCache) so appends write in place; `new` gives
    the batch size, trailing shapes and dtypes of a fresh store.
    """
    if store is not None and capacity(store) >= needed:
        return store
    grown = {}
    for name, arr in new.items():
        if store is None:
            grown[name] = zeros_for(arr, arr.shape[0], round_up(needed, step))
            continue
        old = store[name]
        kept = tokens(old, 0, used) if used < capacity(store) else old
        extra = zeros_for(old, old.shape[0], round_up(needed, step) - used)
        grown[name] = mx.concatenate([kept, extra], axis=TOKEN_AXIS)  # [B, H, cap, ...]
    return grown


def write(store: Store, new: Store, start: int) -> None:
    """Write `new` (each [B, H, L, ...]) at tokens [start, start + L) in place."""
    for name, arr in new.items():
        store[name][:, :, start : start + arr.shape[TOKEN_AXIS]] = arr


def pad(x: mx.array, left: int, right: int) -> mx.array:
    """Zero-pad x [B, H, T, ...] along tokens."""
    if left == 0 and right == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[TOKEN_AXIS] = (left, right)
    return mx.pad(x, widths)


def roll_rows(x: mx.array, shifts: mx.array) -> mx.array:
    """Roll each batch row of x [B, H, T, ...] right by shifts[b] tokens (wrapping)."""
    n = x.shape[TOKEN_AXIS]
    index = (mx.arange(n)[None] - shifts[:, None]) % n  # [B, T]: source token of each slot
    index = index.reshape(index.shape[0], 1, n, *([1] * (x.ndim - 3)))  # [B, 1, T, 1...]
    return mx.take_along_axis(x, index, axis=TOKEN_AXIS)
