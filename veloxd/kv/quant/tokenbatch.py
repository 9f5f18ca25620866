"""`TokenQuantBatchCache`: several requests' per-token packed caches, left-padded, still packed.

Modelled on mlx_lm's BatchKVCache (same left-padding bookkeeping, array `offset`, right padding
rolled into left padding by `finalize`), but over a codec's arrays instead of fp16 keys and
values. Every move that keeps data (filter, extract) copies it, so no view pins a parent buffer.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

from veloxd.kv.base import BatchCache, LayerSpec, VeloxCache, int_list
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops import packing
from veloxd.kv.quant.tokencache import TokenCodec, TokenQuantCache, append_window, attend_store
from veloxd.kv.quant.window import RecentWindow


class TokenQuantBatchCache(BatchCache, VeloxCache):
    """Several requests' token caches, left-padded to a common length, still packed.

    Each method declares its own subclass (`batches=` its per-request class), which `extract`
    returns rows as.
    """

    single_class: ClassVar[type[TokenQuantCache]]
    step = packing.CAPACITY_STEP

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, left_padding: list[int]) -> None:
        super().__init__(config, layer)
        self.codec: TokenCodec | None = None
        self.store: dict[str, mx.array] | None = None  # name -> [B, Hkv, capacity, ...]
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])  # per-row true position
        self._idx = 0  # tokens written per row, left padding included
        self._right_padding: mx.array | None = None
        self._lengths: mx.array | None = None  # real prompt tokens per row of a padded prefill
        self._prompt_written = 0  # tokens appended since that prefill's `prepare`
        self._pad_room = 0  # window slots kept for the rows' padding until `finalize`
        self.window: RecentWindow | None = None  # aligned to the buffer end, as in the rows' caches

    @classmethod
    def from_caches(cls, caches: list[TokenQuantCache]) -> TokenQuantBatchCache:
        first = caches[0]
        if any(type(c) is not type(first) for c in caches):
            raise ValueError(f"cannot merge {sorted({type(c).__name__ for c in caches})} into one batch")
        lengths = [c.size() for c in caches]
        longest = max(lengths)
        batch = cls(first.config, first.layer, [longest - n for n in lengths])
        filled = [c for c in caches if c.store is not None and c.size() > 0]
        if not filled:
            return batch
        template = filled[0].store
        assert template is not None  # filled holds caches with a store
        batch.codec = filled[0].codec
        store = {n: packing.zeros_for(a, len(caches), longest) for n, a in template.items()}
        for row, (c, n) in enumerate(zip(caches, lengths)):
            if n == 0:
                continue
            assert c.store is not None  # a cache holding tokens has a store
            if next(iter(c.store.values())).shape[0] != 1:
                raise ValueError("merge expects per-request caches with batch size 1")
            for name, a in c.store.items():
                store[name][row : row + 1, :, longest - n : longest] = packing.tokens(a, 0, n)
        batch.store = store
        batch._idx = longest
        batch.offset = batch.offset + longest
        window = filled[0].window
        if window is not None:  # each row's window is aligned to its end, which is now the common end
            batch.window = RecentWindow.concat([c.window or blank_rows(window, 1) for c in caches])
        return batch

    # --- the compute path ---
    def append(self, keys: mx.array, values: mx.array) -> None:
        if self.codec is None:
            self.codec = self.single_class.codec_type(self.config, self.layer, keys.shape[-1], values.shape[-1])
        encoded = self.codec.encode(keys, values)
        n_new = keys.shape[2]
        self.store = packing.ensure_capacity(self.store, encoded, self._idx, self._idx + n_new, self.step)
        packing.write(self.store, encoded, self._idx)
        self._idx += n_new
        self.offset = self.offset + n_new
        self.window = append_window(self.window, self.codec, self.config, keys, values, self._pad_room)
        if self.window is not None and self._lengths is not None:  # a right-padded prefill
            self._prompt_written += n_new
            self.window.pads = mx.maximum(self._prompt_written - self._lengths, 0)  # [B]

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        assert self.codec is not None and self.store is not None  # update_and_fetch appended first
        out = attend_store(
            self.codec, self.store, self._idx, queries, scale, mask, self.block, self.window, self.decode_block
        )
        if self.window is not None:  # the chunk is read; a padded prefill keeps room for its padding
            self.window.shrink(self._pad_room)
        return out

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **kwargs: Any) -> mx.array:
        if window_size is not None:
            raise ValueError("veloxd caches do not serve sliding-window attention layers")
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding)

    # --- BatchGenerator protocol ---
    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None:
        if left_padding is not None:
            if self.store is not None:
                raise ValueError("left padding can only be added to an empty batch cache")
            pad = mx.array(left_padding)
            self.left_padding = self.left_padding + pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)
            self._lengths = None if lengths is None else mx.array(lengths)
            self._prompt_written = 0
            self._pad_room = max(right_padding) if lengths is not None else 0

    def finalize(self) -> None:
        """Turn the right padding of the last prompt chunk into left padding (roll each row)."""
        if self._right_padding is None:
            return
        pad = self._right_padding
        if self.store is not None:
            self.store = {n: packing.roll_rows(a, pad) for n, a in self.store.items()}
        if self.window is not None and self.window.pads is not None:
            self.window.settle()  # its rows' real ends now sit at the buffer end
        elif self.window is not None:  # padding of unknown lengths: what stays inside still reads exactly
            self.window.roll_rows(pad)
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad
        self._right_padding = self._lengths = None
        self._pad_room = 0

    def filter(self, batch_indices: list[int]) -> None:
        rows = mx.array(batch_indices)
        self.offset = self.offset[rows]
        self.left_padding = self.left_padding[rows]
        shift = min(int_list(self.left_padding)) if len(batch_indices) else 0
        if self.store is not None:
            # one owned copy: selected rows, without the padding every row shares
            self.store = packing.owned_view(self.store, shift, packing.capacity(self.store), rows)
        if self.window is not None:
            self.window = self.window.rows(rows)
        self._idx -= shift
        self.left_padding = self.left_padding - shift

    def extend(self, other: TokenQuantBatchCache) -> None:
        """Append other's rows; both are right-justified to the longer one."""
        self.codec = self.codec or other.codec
        if self.store is None and other.store is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            self._idx = max(self._idx, other._idx)
            return
        template = self.store if self.store is not None else other.store
        assert template is not None  # not both None (returned above)
        longest = max(self._idx, other._idx)
        width = max(packing.capacity(self.store), packing.capacity(other.store), longest)

        def justified(c: TokenQuantBatchCache) -> tuple[dict[str, mx.array], mx.array]:
            left = longest - c._idx
            rows = c.offset.shape[0]
            out = {}
            for name, t in template.items():
                a = packing.tokens(c.store[name], 0, c._idx) if c.store is not None else packing.zeros_for(t, rows, 0)
                out[name] = packing.pad(a, left, width - left - a.shape[2])
            return out, c.left_padding + left

        mine, my_pad = justified(self)
        theirs, their_pad = justified(other)
        self.store = {n: mx.concatenate([mine[n], theirs[n]]) for n in template}
        like = self.window or other.window
        if like is not None:  # rows keep their windows: both sides are aligned to the common end
            mine_w = self.window or blank_rows(like, self.offset.shape[0])
            self.window = RecentWindow.concat([mine_w, other.window or blank_rows(like, other.offset.shape[0])])
        self.left_padding = mx.concatenate([my_pad, their_pad])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = longest

    def extract(self, idx: int) -> TokenQuantCache:
        """Row `idx` as a per-request cache (owned copies, no padding)."""
        cache = self.single_class(self.config, self.layer)
        cache.codec = self.codec
        padding = int_list(self.left_padding)[idx]
        n = self._idx - padding
        if self.store is not None and n > 0:
            cache.store = packing.owned_view(self.store, padding, self._idx, slice(idx, idx + 1))
            if self.window is not None:
                cache.window = self.window.rows(slice(idx, idx + 1))
        cache.offset = n
        return cache

    # --- bookkeeping ---
    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.store is None

    def arrays(self) -> list[mx.array]:
        fixed = self.codec.constants() if self.codec is not None else []
        bookkeeping = [a for a in (self.offset, self.left_padding, self._right_padding) if a is not None]
        recent = self.window.arrays() if self.window is not None else []
        return [*(self.store or {}).values(), *fixed, *bookkeeping, *recent]

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        if self.window is not None:
            self.window.trim(n)
        return n

    @property
    def state(self) -> tuple:
        """Arrays to evaluate after each prefill chunk (batch caches are not persisted: extract rows)."""
        arrays = [] if self.store is None else [packing.tokens(a, 0, self._idx) for a in self.store.values()]
        recent = self.window.arrays() if self.window is not None else []
        return (*arrays, *recent, self.offset, self.left_padding)

    @state.setter
    def state(self, v: tuple) -> None:
        raise AttributeError("TokenQuantBatchCache is not persisted: extract its rows")


def blank_rows(like: RecentWindow, rows: int) -> RecentWindow:
    """A window of `rows` rows holding nothing exact (rows of a cache with no tokens yet)."""
    return RecentWindow.empty(like.size, like.keys, like.values, batch=rows)
