"""Shared engine of the eviction caches: retained tokens in slots tagged with absolute positions.

Layout: every per-slot array has the slot axis at 2 — keys [B, Hkv, C, D] and values
[B, Hkv, C, Dv] in the activation dtype, positions [B, Hkv, C] int32 (the true position each
key was rotated at; EMPTY marks a free slot) and a method's scores [B, Hkv, C]. Attention
visibility comes from positions, so slot order is free and a decode step writes its token into
a free slot in place. A prefill chunk is appended, attended, then compacted: a gather into a
new buffer (a slice would pin its parent; copying is what frees memory).

A step of L tokens sees the retained tokens plus itself (causally), then the method evicts
down to its budget: between steps at most `budget` tokens are retained per row and KV head,
during a step at most budget + L (decode: one spare slot). `offset` stays the true position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.evict import attention
from veloxd.kv.evict import slots as store
from veloxd.kv.evict.slots import EMPTY


@dataclass
class Step:
    """The tokens appended since the last attend; per row, chunk indices [lo, hi) are real."""

    length: int
    base: list[int]  # position of chunk index 0, per row
    lo: list[int]
    hi: list[int]
    first_slot: int | None  # L > 1: slot of chunk index 0 (appended at the end); None for L == 1

    def qpos(self) -> mx.array:
        return mx.array(self.base)[:, None] + mx.arange(self.length)[None]  # [B, L]

    def qvalid(self) -> mx.array:
        i = mx.arange(self.length)[None]  # [1, L]
        return (i >= mx.array(self.lo)[:, None]) & (i < mx.array(self.hi)[:, None])  # [B, L]

    @property
    def padded(self) -> bool:
        return any(lo != 0 or hi != self.length for lo, hi in zip(self.lo, self.hi))


class EvictionCache(VeloxCache):
    """Base of the per-request eviction caches (one row; the batch classes reuse it with B rows)."""

    uniform_heads = False  # True: one decision per layer, every KV head keeps the same tokens
    row_lists: tuple[str, ...] = ("offsets", "counts", "evicted")  # host-side state per row
    row_fill: ClassVar[Mapping[str, int]] = {}  # value of padding rows in `rows` arrays (default 0)

    def __init__(self, config: KVCacheConfig, layer: LayerSpec) -> None:
        super().__init__(config, layer)  # sets offset = 0
        self.budget = self.layer_budget()
        self.slots: dict[str, mx.array] = {}
        self.rows: dict[str, mx.array] = {}  # method arrays with a batch axis, no slot axis
        self.counts = [0]
        self.evicted = [False]
        self._left: list[int] | None = None  # batch prompts: left padding still to come
        self._real: list[int] | None = None  # batch prompts: real tokens still to come
        self._step: Step | None = None

    # --- method hooks ---
    def layer_budget(self) -> int:
        raise NotImplementedError

    def capacity_limit(self) -> int:
        """Most slots a row ever needs: the budget plus the token of a decode step."""
        return self.budget + 1

    def new_extras(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        """Per-slot method arrays [B, Hkv, L] for new tokens."""
        return {}

    def window_rule(self) -> attention.WindowRule | None:
        return None

    def keep_priority(self, step: Step) -> mx.array:
        """[B, Hkv, C]: higher is kept; +inf is never evicted."""
        raise NotImplementedError

    def run_attention(self, queries: mx.array, scale: float, step: Step) -> mx.array:
        keys, values, mask = self.attention_view(step)
        return attention.attend(queries, keys, values, scale, mask, self.block, decode_block=self.decode_block)

    # --- storage hooks: fp16 slots here; veloxd.kv.evict.packed keeps a quantizer's codes instead ---
    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        """Per-slot arrays [B, Hkv, L, ...] that store new keys/values [B, Hkv, L, D]."""
        return {"keys": keys, "values": values}

    def operands(self, n: int | None = None) -> tuple[attention.Keys, attention.Values]:
        """Keys and values of the first `n` slots (all: None), as attention reads them."""
        return self.slots["keys"][:, :, :n], self.slots["values"][:, :, :n]

    def attention_view(self, step: Step) -> tuple[attention.Keys, attention.Values, str | attention.MaskFn | None]:
        """Keys, values and their visibility for this step (prefill chunk or decode token)."""
        if step.length > 1:
            return (*self.operands(), self.step_mask(step))
        return self.decode_view(step)

    def enforce(self, step: Step) -> None:
        over = [c > self.budget for c in self.counts]
        if not any(over):
            return
        priority = self.keep_priority(step)
        if step.length == 1 and max(self.counts) <= self.budget + 1:
            self.evict_one(priority, over)
        else:
            self.compact(priority, [min(c, self.budget) for c in self.counts])
        self.mark_evicted(over)

    def on_trim(self, cut: int) -> None:
        """Drop method state about positions >= cut."""

    # --- offset: the true position ---
    @property
    def offset(self) -> Any:
        return self.offsets[0]

    @offset.setter
    def offset(self, value: int) -> None:
        self.offsets = [int(value)]

    # --- the cache protocol ---
    def append(self, keys: mx.array, values: mx.array) -> None:
        B, _, L, _ = keys.shape
        if not self.slots and len(self.offsets) == 1 and B > 1:  # one cache used for B equal rows
            for name in self.row_lists:
                setattr(self, name, getattr(self, name) * B)
        lo, hi = self._real_range(B, L)
        base = [o - a for o, a in zip(self.offsets, lo)]
        step = Step(L, base, lo, hi, None)
        pos = mx.where(step.qvalid(), step.qpos(), EMPTY).astype(mx.int32)  # [B, L]
        new = {**self.encode(keys, values), "positions": mx.broadcast_to(pos[:, None], keys.shape[:3])}
        new.update(self.new_extras(keys, values))
        if L == 1:
            self._write_one(new)
        else:
            self.normalize()
            step.first_slot = self.width
            if self.slots:
                self.slots = {n: mx.concatenate([self.slots[n], a], axis=2) for n, a in new.items()}
            else:  # owned copies: the model's keys/values may be views into a larger projection
                self.slots = {n: mx.contiguous(a) for n, a in new.items()}
        added = [h - a for a, h in zip(lo, hi)]
        self.offsets = [o + n for o, n in zip(self.offsets, added)]
        self.counts = [c + n for c, n in zip(self.counts, added)]
        self._step = step

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        """Attention over retained + new tokens (the passed mask is ignored: see module doc)."""
        step, self._step = self._step, None
        if step is None:
            raise RuntimeError(f"{type(self).__name__}.attend called without update_and_fetch")
        out = self.run_attention(queries, scale, step)
        self.enforce(step)
        return out

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs: Any) -> Any:
        # attend builds its own visibility from slot positions; this only has to be well-formed.
        if window_size is not None:
            raise ValueError("veloxd caches do not serve sliding-window attention layers")
        if return_array:
            return create_causal_mask(N, self.size())
        return None if N == 1 else "causal"

    # --- visibility ---
    def step_mask(self, step: Step) -> str | attention.MaskFn:
        """Prefill chunk: visibility from head 0's positions (normalize() made free slots equal
        across heads), built per block by the attention."""
        rule = self.window_rule()
        if (
            len(self.counts) == 1
            and rule is None
            and not step.padded
            and step.first_slot == self.counts[0] - step.length
        ):
            return "causal"  # everything before the chunk is visible: the lower-right causal mask
        own = step.first_slot if step.padded else None  # a padding query sees itself
        return attention.slot_mask(self.slots["positions"][:, :1], step.qpos(), rule, own)

    def decode_view(self, step: Step) -> tuple[attention.Keys, attention.Values, attention.MaskFn | None]:
        """Keys, values and visibility (None: all) for a one-token step.

        Every retained token is visible to the newest one (streaming's window rule never hides
        a retained token at decode: it keeps exactly the sinks and the window). One row has its
        free slots at the end at this point (a decode write fills the first free slot, the only
        one not at the end; compaction packs), so it attends over its first `count` slots.
        """
        if len(self.counts) == 1:
            return (*self.operands(self.counts[0]), None)
        pos = self.slots["positions"]
        mask = attention.slot_mask(pos[:, :1] if self.uniform_heads else pos, step.qpos())
        return (*self.operands(), mask)

    def widen(self, scores: mx.array) -> mx.array:
        """Per-slot scores [.., n] from attention_view, padded with zeros to the buffer width."""
        missing = self.width - scores.shape[-1]
        return mx.pad(scores, [(0, 0)] * (scores.ndim - 1) + [(0, missing)]) if missing else scores

    # --- storage primitives ---
    @property
    def width(self) -> int:
        return store.width(self.slots)

    def recent(self, window: int) -> mx.array:
        """[B, Hkv, C] bool: the `window` most recent positions of each row."""
        newest = mx.array(self.offsets)[:, None, None]
        pos = self.slots["positions"]
        return (pos >= newest - window) & (pos != EMPTY)

    def compact(self, priority: mx.array, keep: list[int]) -> None:
        """Keep the `keep[b]` highest-priority tokens of each row (a gather: old buffers are freed)."""
        self.slots = store.compact(self.slots, priority, keep)

    def normalize(self) -> None:
        """Pack each row's tokens at the front, equal across heads; drop columns no row uses."""
        if self.slots and self.width > min(self.counts):
            self.compact(mx.zeros(self.slots["positions"].shape), list(self.counts))

    def evict_one(self, priority: mx.array, rows: list[bool]) -> None:
        self.slots = store.evict_one(self.slots, priority, rows)

    def mark_evicted(self, rows: list[bool]) -> None:
        self.counts = [min(c, self.budget) if r else c for c, r in zip(self.counts, rows)]
        self.evicted = [e or r for e, r in zip(self.evicted, rows)]

    def _write_one(self, new: dict[str, mx.array]) -> None:
        need = max(self.counts) + 1
        if self.width < need:
            target = store.grow_target(need, self.capacity_limit())
            self.slots = store.pad(self.slots, target, new, len(self.counts))
        self.slots = store.write_one(self.slots, new)

    def _real_range(self, B: int, L: int) -> tuple[list[int], list[int]]:
        lo, hi = [0] * B, [L] * B
        if self._left is not None:
            lo = [min(L, a) for a in self._left]
            self._left = [a - n for a, n in zip(self._left, lo)]
            self._left = self._left if any(self._left) else None
        if self._real is not None:
            hi = [a + min(L - a, r) for a, r in zip(lo, self._real)]
            self._real = [r - (h - a) for r, a, h in zip(self._real, lo, hi)]
        return lo, hi

    # --- bookkeeping ---
    def size(self) -> int:
        return max(self.counts)

    def empty(self) -> bool:
        return not self.slots

    def arrays(self) -> list[mx.array]:
        return [*self.slots.values(), *self.rows.values()]

    def is_trimmable(self) -> bool:
        """Exact only while nothing has been evicted (an evicted token cannot come back)."""
        return not any(self.evicted)

    def trim(self, n: int) -> int:
        if any(self.evicted):
            raise ValueError(f"{type(self).__name__} has evicted tokens: it cannot be trimmed exactly")
        n = min(n, self.offset)
        if n <= 0:
            return 0
        cut = self.offset - n
        if self.slots:
            pos = self.slots["positions"]
            self.compact(mx.where(pos >= cut, -mx.inf, 0.0), [cut])
        self.offsets, self.counts = [cut], [cut]
        self.on_trim(cut)
        return n

    # --- persistence: (meta, *slot arrays, *row arrays) ---
    def meta_extra(self) -> dict[str, Any]:
        lists = {name: getattr(self, name) for name in self.row_lists if name != "offsets"}
        return {"slots": list(self.slots), "rows": list(self.rows), **lists}

    @property
    def state(self) -> tuple:
        return (self.meta, *self.slots.values(), *self.rows.values())

    @state.setter
    def state(self, v: tuple) -> None:
        extra = self.restore_meta(v[0])
        self.budget = self.layer_budget()
        self._left = self._real = self._step = None
        for name in self.row_lists:
            if name != "offsets":
                setattr(self, name, list(extra[name]))
        arrays = list(v[1:])
        if len(arrays) != len(extra["slots"]) + len(extra["rows"]):
            raise ValueError(
                f"{type(self).__name__}: state holds {len(arrays)} arrays, meta names {extra['slots'] + extra['rows']}"
            )
        self.slots = dict(zip(extra["slots"], arrays[: len(extra["slots"])]))
        self.rows = dict(zip(extra["rows"], arrays[len(extra["slots"]) :]))
