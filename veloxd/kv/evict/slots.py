"""Slot storage of the eviction caches: per-slot arrays with the slot axis at 2, tagged by position.

`slots` maps a name to an array [B, Hkv, C, ...]: "keys", "values", "positions" (int32, the
absolute position of the token in the slot, EMPTY when free) and method scores. Every function
returns new arrays: compaction is a gather into fresh buffers (a slice would pin its parent),
single-token writes are scatters MLX performs in place when the buffer is not shared.
"""

from __future__ import annotations

import math

import mlx.core as mx

from veloxd.kv.ops.packing import CAPACITY_STEP

EMPTY = 2**31 - 1  # position of a free slot: above every query position, so never visible
FILL = {"positions": EMPTY}  # value of new or padding slots, per array (default 0)

Slots = dict[str, mx.array]


def width(slots: Slots) -> int:
    return slots["positions"].shape[2] if slots else 0


def compact(slots: Slots, priority: mx.array, keep: list[int]) -> Slots:
    """Keep the `keep[b]` highest-priority tokens of each row (per KV head), in slot order.

    priority [B, 1 | Hkv, C]: higher is kept, +inf always (within keep). Rows keeping fewer
    than the widest get free slots at the end. Returns new buffers of width max(keep).
    """
    kept_width = max(keep, default=0)
    if kept_width == 0:
        return {}
    pos = slots["positions"]
    C = pos.shape[2]
    ranked = mx.argsort(-mx.where(pos == EMPTY, -mx.inf, priority), axis=-1)[..., :kept_width].astype(mx.int32)
    kept = mx.arange(kept_width)[None, None] < mx.array(keep)[:, None, None]  # [B, 1, K]
    order = mx.sort(mx.where(kept, ranked, ranked + C), axis=-1)  # kept slots in slot order, then dropped
    index = order % C  # [B, Hkv, K]
    out = {n: mx.take_along_axis(a, index if a.ndim == 3 else index[..., None], axis=2) for n, a in slots.items()}
    out["positions"] = mx.where(order >= C, EMPTY, out["positions"])
    return out


def evict_one(slots: Slots, priority: mx.array, rows: list[bool]) -> Slots:
    """Free the lowest-priority slot of each selected row and KV head (only positions change)."""
    pos = slots["positions"]
    victim = mx.argmin(mx.where(pos == EMPTY, mx.inf, priority), axis=-1)  # [B, Hkv]
    hit = mx.arange(pos.shape[2]) == victim[..., None]  # [B, Hkv, C]
    if not all(rows):
        hit = hit & mx.array(rows)[:, None, None]
    return {**slots, "positions": mx.where(hit, EMPTY, pos)}


def write_one(slots: Slots, new: Slots) -> Slots:
    """Write one token per row (new: [B, Hkv, 1, ...]) into each row's and head's first free slot."""
    free = mx.argmax(slots["positions"] == EMPTY, axis=-1).astype(mx.int32)  # [B, Hkv]
    out = {}
    for name, a in slots.items():
        index = free[..., None] if a.ndim == 3 else free[..., None, None]
        out[name] = mx.put_along_axis(a, index, new[name], axis=2)
    return out


def grow_target(need: int, limit: int) -> int:
    """Width after growing to hold `need` slots: the next CAPACITY_STEP multiple, capped at `limit`."""
    return max(need, min(math.ceil(need / CAPACITY_STEP) * CAPACITY_STEP, limit))


def pad(slots: Slots, target: int, template: Slots, rows: int) -> Slots:
    """Free slots appended up to width `target`; names missing in `slots` (or all, when it is
    empty) are built from `template`'s shapes with `rows` rows."""
    out = {}
    for name, t in template.items():
        have = slots.get(name)
        extra = target - (have.shape[2] if have is not None else 0)
        if have is not None and extra == 0:
            out[name] = have
            continue
        fill = mx.full((rows, t.shape[1], extra, *t.shape[3:]), FILL.get(name, 0), dtype=t.dtype)
        out[name] = fill if have is None else mx.concatenate([have, fill], axis=2)
    return out
