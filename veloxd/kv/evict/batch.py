"""Batched decode for eviction caches: mlx_lm's BatchGenerator protocol over the same slot layout.

Each policy module declares `<Method>BatchCache(EvictionBatch, <Method>Cache,
batches=<Method>Cache)`: the method class with B rows and an array `offset` (each row's true
position, for RoPE); `<Method>Cache.merge` returns it. Rows are independent: each keeps its own budget, positions and
scores. Padding is nothing but free slots (position EMPTY), so `finalize` needs no roll and
`filter` / `extract` are gathers into new buffers (owned copies, nothing pinned).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import mlx.core as mx

from veloxd.kv.base import BatchCache
from veloxd.kv.evict import slots as store
from veloxd.kv.evict.engine import EvictionCache

# The batch mixin always sits in front of an EvictionCache subclass (`<Method>BatchCache(EvictionBatch,
# <Method>Cache)`): the type checker sees that base, the runtime MRO stays (EvictionBatch, method class).
if TYPE_CHECKING:
    _MixedInto = EvictionCache
else:
    _MixedInto = object


def stack_slots(parts: list[tuple[dict[str, mx.array], int]]) -> dict[str, mx.array]:
    """Concatenate per-row slot dicts (dict, n_rows) along the batch axis, padded with free slots
    to the widest; an empty dict stands for n_rows rows of free slots."""
    template = next((d for d, _ in parts if d), None)
    if template is None:
        return {}
    target = max(store.width(d) for d, _ in parts)
    padded = [store.pad(d, target, template, n) for d, n in parts]
    return {name: mx.concatenate([p[name] for p in padded], axis=0) for name in template}


def stack_rows(parts: list[tuple[dict[str, mx.array], int]], fill: Mapping[str, int]) -> dict[str, mx.array]:
    """Concatenate per-row arrays (no slot axis) along the batch axis; missing ones are `fill`."""
    template = next((d for d, _ in parts if d), None)
    if template is None:
        return {}
    return {
        name: mx.concatenate(
            [d.get(name, mx.full((n, *t.shape[1:]), fill.get(name, 0), dtype=t.dtype)) for d, n in parts]
        )
        for name, t in template.items()
    }


class EvictionBatch(BatchCache, _MixedInto):
    """Mixed in front of a method class (see the module doc). Not persisted: rows are extracted."""

    single_class: ClassVar[type[EvictionCache]]

    @property
    def offset(self) -> mx.array:
        left = self._left or [0] * len(self.offsets)
        return mx.array([o - a for o, a in zip(self.offsets, left)])  # RoPE position of chunk index 0

    @offset.setter
    def offset(self, value: int) -> None:
        self.offsets = [int(value)]

    @classmethod
    def from_caches(cls, caches: list[EvictionCache]) -> EvictionCache:
        first = caches[0]
        kinds = {type(c).__name__ for c in caches}
        if len(kinds) > 1:
            raise ValueError(f"cannot merge {sorted(kinds)} into one batch")
        batch = cls(first.config, first.layer)
        for name in first.row_lists:
            setattr(batch, name, [x for c in caches for x in getattr(c, name)])
        for c in caches:
            c.normalize()
        batch.slots = stack_slots([(c.slots, len(c.offsets)) for c in caches])
        batch.rows = stack_rows([(c.rows, len(c.offsets)) for c in caches], first.row_fill)
        return batch

    # --- BatchGenerator protocol ---
    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        """The next chunk is padded: left padding (empty caches only) or right padding after `lengths`."""
        if left_padding is not None:
            if self.slots:
                raise ValueError("left padding can only be added to an empty batch cache")
            self._left = [a + b for a, b in zip(self._left or [0] * len(self.offsets), left_padding)]
        if right_padding is not None and max(right_padding) > 0:
            assert lengths is not None  # mlx_lm passes the lengths with the right padding
            self._real = list(lengths)

    def finalize(self) -> None:
        self._real = None  # padding tokens were stored as free slots: nothing to roll

    def filter(self, batch_indices: list[int]) -> None:
        """Keep these rows (a gather: the dropped rows' memory is released)."""
        rows = mx.array(batch_indices, dtype=mx.int32)
        for name in self.row_lists:
            setattr(self, name, [getattr(self, name)[i] for i in batch_indices])
        for pending in ("_left", "_real"):
            if getattr(self, pending) is not None:
                setattr(self, pending, [getattr(self, pending)[i] for i in batch_indices])
        if not batch_indices:
            self.slots, self.rows = {}, {}
            return
        self.slots = {n: mx.take(a, rows, axis=0) for n, a in self.slots.items()}
        self.rows = {n: mx.take(a, rows, axis=0) for n, a in self.rows.items()}
        if self.slots and self.width > max(self.counts) + 1:
            self.normalize()  # drop the columns only the finished rows needed

    def extend(self, other: EvictionCache) -> None:
        """Append other's rows."""
        n_self, n_other = len(self.offsets), len(other.offsets)
        for pending in ("_left", "_real"):
            mine, theirs = getattr(self, pending), getattr(other, pending)
            if mine is not None or theirs is not None:
                setattr(self, pending, (mine or [0] * n_self) + (theirs or [0] * n_other))
        self.slots = stack_slots([(self.slots, n_self), (other.slots, n_other)])
        self.rows = stack_rows([(self.rows, n_self), (other.rows, n_other)], self.row_fill)
        for name in self.row_lists:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def extract(self, idx: int) -> EvictionCache:
        """Row `idx` as a per-request cache, in owned buffers."""
        single = self.single_class(self.config, self.layer)
        for name in self.row_lists:
            setattr(single, name, [getattr(self, name)[idx]])
        row = mx.array([idx], dtype=mx.int32)
        if self.slots and single.counts[0] > 0:
            single.slots = {n: mx.take(a, row, axis=0) for n, a in self.slots.items()}
            single.compact(mx.zeros(single.slots["positions"].shape), list(single.counts))
        single.rows = {n: mx.take(a, row, axis=0) for n, a in self.rows.items()}
        return single

    # --- bookkeeping ---
    def is_trimmable(self) -> bool:
        return False

    def trim(self, n: int) -> int:
        raise ValueError("batched eviction caches are not trimmed; extract a row first")

    @property
    def state(self) -> tuple:
        """Arrays to evaluate after each prefill chunk (batch caches are never saved)."""
        return (*self.slots.values(), *self.rows.values())

    @state.setter
    def state(self, v: Any) -> None:
        raise ValueError("batched eviction caches are not restored from state; merge per-request caches")
