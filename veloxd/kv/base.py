"""`VeloxCache`: the contract every veloxd compressed cache implements.

A VeloxCache stores what `update_and_fetch` gives it in its own compressed form and returns
sentinels instead of keys and values; the attention dispatcher (veloxd.kv.attention) then
calls `cache.attend(queries, scale, mask)`, which computes attention from the stored form.
Nothing is ever handed back to mlx_lm as fp16 keys and values.

Contract (mlx_lm 0.32 cache protocol plus veloxd's additions):
- `offset`: int, the true absolute position (tokens seen), so RoPE stays right after eviction.
- `size()`: tokens stored; `empty()`; `nbytes`: bytes of the arrays really held.
- `state` / setter round-trip through mlx_lm's save_prompt_cache / load_prompt_cache; the
  class must be registered with `register_cache_class` so load_prompt_cache finds it.
- `is_trimmable()` / `trim(n)`: exact where the method allows it.
- `make_mask(N, return_array=False, window_size=None)` and `attend(queries, scale, mask)`.
- `merge(caches)` classmethod only on batchable methods (mlx_lm batches a cache when it has
  `merge`); it returns a batch cache that is itself a VeloxCache (never mlx_lm's fp16
  BatchKVCache).

Batching has one style: a batchable per-request class mixes in `Batchable`, and its module
declares the batch class next to it, naming what it batches:

    class AffineBatchCache(TokenQuantBatchCache, batches=AffineCache): ...

`BatchCache.__init_subclass__` links the two (`AffineCache.batch_class`, `single_class`), so
`merge` needs no lazy import and no class is built at run time. `nbytes` is shared: every cache
lists the arrays it holds in `arrays()`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops.blockwise import DEFAULT_BLOCK
from veloxd.serve.mlx_compat.models import BaseCache


@dataclass(frozen=True)
class LayerSpec:
    """Where a cache sits: its index among the compressed layers, and how many there are."""

    index: int
    n_layers: int


class Stored:
    """What `update_and_fetch` returns in place of keys/values: a marker, never data."""

    __slots__ = ("cache",)

    def __init__(self, cache: VeloxCache) -> None:
        self.cache = cache


class VeloxCache(BaseCache):
    """Base class: bookkeeping shared by all methods. Subclasses store and attend."""

    block = DEFAULT_BLOCK  # keys per attention block: bounds one call's transient memory
    # Keys per block of a decode step; None (always, when serving): the method's own choice, one pass
    # over every stored key for most (veloxd.kv.ops.blockwise). Tests set it on a cache to compare the
    # one pass with the block loop's online softmax.
    decode_block: int | None = None
    # Tokens seen: an int in a per-request cache; a batch cache holds one per row (an mx.array), as
    # mlx_lm's BatchKVCache does, and mlx_lm's models read either. Hence no narrower type here.
    offset: Any

    def __init__(self, config: KVCacheConfig, layer: LayerSpec) -> None:
        self.config = config
        self.layer = layer
        self.offset = 0

    # --- to implement ---
    def append(self, keys: mx.array, values: mx.array) -> None:
        """Store new post-RoPE keys/values [B, Hkv, L, D] and advance `offset` by L."""
        raise NotImplementedError

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        """Attention output [B, Hq, L, Dv] of queries [B, Hq, L, D] over everything stored."""
        raise NotImplementedError

    # --- the mlx_lm protocol ---
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Stored, Stored]:
        self.append(keys, values)
        marker = Stored(self)
        return marker, marker

    @property
    def meta(self) -> str:
        """JSON of what from_state needs besides arrays: config, layer, offset, extras."""
        return json.dumps(
            {
                "config": self.config.to_dict(),
                "layer": [self.layer.index, self.layer.n_layers],
                "offset": self.offset,
                "extra": self.meta_extra(),
            }
        )

    def meta_extra(self) -> dict[str, Any]:
        return {}

    def restore_meta(self, text: str) -> dict[str, Any]:
        """Inverse of `meta`; returns the `extra` dict for the subclass."""
        data = json.loads(text)
        self.config = KVCacheConfig.from_dict(data["config"])
        self.layer = LayerSpec(*data["layer"])
        self.offset = int(data["offset"])
        return data["extra"]

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        if window_size is not None:
            raise ValueError("veloxd caches do not serve sliding-window attention layers")
        return mlx_cache.create_attention_mask(N, self.offset, return_array, None)

    @classmethod
    def check_head_dims(cls, config: KVCacheConfig, k_dim: int, v_dim: int) -> None:
        """ValueError when this method cannot store heads of these dimensions (before any load)."""

    # --- memory: one definition for every cache ---
    def arrays(self) -> list[mx.array]:
        """Every MLX array this cache holds (stored tokens, constants, bookkeeping)."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes of every array held: what the cache really keeps resident."""
        return array_bytes(self.arrays())


class Batchable:
    """Mixin of per-request caches that mlx_lm's BatchGenerator may merge into a batch."""

    batch_class: ClassVar[type[BatchCache]]

    @classmethod
    def merge(cls, caches: list[Any]) -> VeloxCache:
        return cls.batch_class.from_caches(caches)


class BatchCache:
    """Mixin of batch caches: `class XBatchCache(FamilyBatch, batches=XCache)` links both ways."""

    single_class: ClassVar[type]

    def __init_subclass__(cls, batches: type[Batchable] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if batches is not None:
            cls.single_class = batches
            batches.batch_class = cls

    @classmethod
    def from_caches(cls, caches: list[Any]) -> VeloxCache:
        raise NotImplementedError


def array_bytes(*arrays: Any) -> int:
    """Bytes held by arrays (None and nested tuples allowed)."""
    total = 0
    for a in arrays:
        if a is None:
            continue
        if isinstance(a, (tuple, list)):
            total += array_bytes(*a)
        else:
            total += a.nbytes
    return total


def int_list(a: mx.array) -> list[int]:
    """The values of a 1-D integer array (mlx types `tolist()` as any nesting of any scalar)."""
    return cast(list[int], a.tolist())


def register_cache_class(cls: type) -> type:
    """Make load_prompt_cache find `cls`: it looks classes up in mlx_lm's cache module namespace."""
    setattr(mlx_cache, cls.__name__, cls)
    return cls
