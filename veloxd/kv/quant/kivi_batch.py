"""`KIVIBatch`: several requests' KIVI rows, still packed (kivi.KIVIBatchCache is what
KIVICache.merge returns).

Rows keep their own group boundaries (each row's quantized tokens start at slot 0), so a
request quantizes exactly the same groups batched as alone; the holes this leaves are masked
from per-row counts inside `attend`, which therefore ignores the model's mask. Right padding
of a prompt chunk is rolled into the residual hole by `finalize` before anything is quantized.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from veloxd.kv.base import BatchCache, LayerSpec, VeloxCache
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.quant.kivi_rows import KIVIRows, RowParts, build_rows


class KIVIBatch(BatchCache, VeloxCache):
    """Rows of `single_class` (a KIVI per-request cache) in one batch."""

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, n_rows: int) -> None:
        # no super().__init__: `offset` is derived from the rows here, not stored
        self.config = config
        self.layer = layer
        self.rows: KIVIRows | None = None
        self.n_rows = n_rows
        self._padding: list[int] | None = None  # right padding of the pending prompt chunk

    @classmethod
    def from_caches(cls, caches: list[Any]) -> KIVIBatch:
        first = caches[0]
        batch = cls(first.config, first.layer, len(caches))
        filled = [c.rows for c in caches if c.rows is not None]
        if filled:
            batch.rows = rebuild(filled[0], [c.rows.row_parts(0) if c.rows is not None else None for c in caches])
        return batch

    @property
    def offset(self) -> mx.array:
        """Per-row true positions (RoPE offsets)."""
        if self.rows is None:
            return mx.zeros((self.n_rows,), mx.int32)
        return mx.array(self.rows.lengths())

    def _parts(self) -> list[RowParts | None]:
        if self.rows is None:
            return [None] * self.n_rows
        return [self.rows.row_parts(b) for b in range(self.n_rows)]

    # --- compute path ---
    def append(self, keys: mx.array, values: mx.array) -> None:
        if self.rows is None:
            B, H, _, D = keys.shape
            self.rows = KIVIRows(self.config, D, values.shape[-1], keys.dtype, B, H)
            self.rows.hold = self._padding is not None
        self.rows.append(keys, values)

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        assert self.rows is not None  # update_and_fetch appended first
        out = self.rows.attend(queries, scale, mask, own_mask=True, block=self.block, decode_block=self.decode_block)
        if not self.rows.hold:
            self.rows.flush()
        return out

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs: Any) -> None:
        """None: `attend` builds each row's mask from its own counts (rows have different holes)."""
        if window_size is not None:
            raise ValueError("veloxd caches do not serve sliding-window attention layers")
        return None

    # --- BatchGenerator protocol ---
    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        if left_padding is not None and max(left_padding, default=0) > 0:
            raise ValueError("kivi batch caches take right-padded prompt chunks only (mlx_lm BatchGenerator)")
        if right_padding is not None and max(right_padding) > 0:
            self._padding = list(right_padding)
            if self.rows is not None:
                self.rows.hold = True

    def finalize(self) -> None:
        if self._padding is None:
            return
        if self.rows is not None:
            self.rows.roll_padding(self._padding)
        self._padding = None

    def filter(self, batch_indices: list[int]) -> None:
        parts = self._parts()
        self.n_rows = len(batch_indices)
        if self.rows is not None:
            self.rows = rebuild(self.rows, [parts[i] for i in batch_indices])
        if self._padding is not None:
            self._padding = [self._padding[i] for i in batch_indices]

    def extend(self, other: KIVIBatch) -> None:
        template = self.rows or other.rows
        if template is not None:
            self.rows = rebuild(template, self._parts() + other._parts())
        self.n_rows += other.n_rows

    def extract(self, idx: int) -> Any:
        cache = self.single_class(self.config, self.layer)
        if self.rows is not None and self.rows.lengths()[idx] > 0:
            cache.rows = rebuild(self.rows, [self.rows.row_parts(idx)])
            cache.offset = cache.rows.lengths()[0]
        return cache

    # --- bookkeeping ---
    def size(self) -> int:
        return 0 if self.rows is None else max(self.rows.lengths())

    def empty(self) -> bool:
        return self.rows is None

    def arrays(self) -> list[mx.array]:
        return [] if self.rows is None else self.rows.arrays()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Trim every row by n (per row exactly as KIVICache.trim)."""
        singles = [self.extract(b) for b in range(self.n_rows)]
        trimmed = [c.trim(n) for c in singles]
        self.rows = type(self).from_caches(singles).rows
        return max(trimmed, default=0)

    @property
    def state(self) -> tuple:
        """Arrays to evaluate after each prefill chunk (batch caches are not persisted: extract rows)."""
        return () if self.rows is None else tuple(self.rows.arrays())

    @state.setter
    def state(self, v: tuple) -> None:
        raise AttributeError("KIVIBatchCache is not persisted: extract its rows")


def rebuild(template: KIVIRows, parts: list[RowParts | None]) -> KIVIRows:
    """New rows shaped like `template` holding `parts` (None = an empty row)."""
    empty = RowParts(
        0,
        0,
        None,
        None,
        mx.zeros((1, template.heads, 0, template.k_dim), template.dtype),
        mx.zeros((1, template.heads, 0, template.v_dim), template.dtype),
    )
    return build_rows(
        template.config, template.k_dim, template.v_dim, template.dtype, template.heads, [p or empty for p in parts]
    )
