"""Generic per-token packed KV cache: a `TokenCodec` decides what is stored, this module stores it.

Interface for per-token methods (affine, turboquant_mse/prod, qjl):

    class MyCodec(TokenCodec):
        fields = ("k_codes", "k_norms", ...)            # names of the per-token arrays
        def __init__(self, config, layer, k_dim, v_dim)  # built lazily on the first append
        def encode(self, keys, values) -> dict           # keys/values [B, Hkv, L, D]; every array
                                                         #   [B, Hkv, L, ...] (packed codes + small metadata)
        def scores(self, q, store) -> mx.array           # q [B, Hkv, R, L, D] pre-scaled -> [B, Hkv, R, L, n]
        def weighted_values(self, p, store) -> mx.array  # p [B, Hkv, R, L, n] -> [B, Hkv, R, L, Dv]
        def rotate_queries(self, q) -> q                 # optional: [B, Hq, L, D], once per attend
        def for_call(self, queries, n_kv_heads) -> codec # optional: the codec one attend uses (a copy
                                                         #   carrying per-call choices; default self)
        def finish(self, out) -> out                     # optional: [B, Hq, L, Dv] (e.g. inverse-rotate)
        def window_keys(self, keys) / window_values(self, values)
                                                         # optional: exact keys/values in the frame
                                                         #   scores/weighted_values work in (the
                                                         #   recent window's copies; default as is)
        def bits_per_token(self) -> float                # analytic bits per token and KV head (K + V)
        def constants(self) -> list[mx.array]            # fixed arrays held (signs, codebooks)

    @register_cache_class                          # so mlx_lm's load_prompt_cache finds it
    class MyCache(Batchable, TokenQuantCache):     # without Batchable when it cannot batch
        codec_type = MyCodec

    class MyBatchCache(TokenQuantBatchCache, batches=MyCache):  # what MyCache.merge returns
        pass

A codec must deep-copy (the server copies caches: no functions/closures as attributes) and
list in `constants()` every array it holds, since `nbytes` must equal the arrays really held
(tests walk every array reachable from a cache and compare).

`store` passed to scores/weighted_values is already sliced to the key block. Tokens sit at axis
2 of every stored array, so growth, trimming, padding, rolling and batching are method-free.
`TokenQuantCache` is the per-request cache (256-token step preallocation, attention through
`blockwise_attention`); `veloxd.kv.quant.tokenbatch.TokenQuantBatchCache` is what `merge` returns
(array offsets, left padding) and stays packed through prepare/finalize/filter/extend/extract.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.config import WINDOWED, KVCacheConfig
from veloxd.kv.ops import blockwise, packing
from veloxd.kv.ops.blockwise import DEFAULT_BLOCK, blockwise_attention
from veloxd.kv.quant import onepass
from veloxd.kv.quant.window import RecentWindow, WindowRead


class TokenCodec:
    """How one layer's keys and values become per-token codes, and attention reads them back."""

    fields: tuple[str, ...] = ()
    # Keys per block of a decode step; None: the whole store in one pass (veloxd.kv.ops.blockwise).
    decode_block: int | None = None

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, k_dim: int, v_dim: int) -> None:
        self.config = config
        self.layer = layer
        self.k_dim = k_dim
        self.v_dim = v_dim

    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        raise NotImplementedError

    def scores(self, q: mx.array, store: dict[str, mx.array]) -> mx.array:
        raise NotImplementedError

    def weighted_values(self, p: mx.array, store: dict[str, mx.array]) -> mx.array:
        raise NotImplementedError

    def rotate_queries(self, q: mx.array) -> mx.array:
        return q

    def for_call(self, queries: mx.array, n_kv_heads: int) -> TokenCodec:
        """The codec one attention call uses: choices made from the whole call (queries [B, Hq, L, D]),
        never from one query block, whose size depends on the local head count."""
        return self

    def finish(self, out: mx.array) -> mx.array:
        return out

    def window_keys(self, keys: mx.array) -> mx.array:
        """Keys [B, H, L, D] in the frame whose dot with rotate_queries(q)[..., :D] is the score."""
        return keys

    def window_values(self, values: mx.array) -> mx.array:
        """Values [B, H, L, Dv] in the frame weighted_values sums in (before `finish`)."""
        return values

    def bits_per_token(self) -> float:
        raise NotImplementedError

    def constants(self) -> list[mx.array]:
        return []


def attend_store(
    codec: TokenCodec,
    store: dict[str, mx.array],
    length: int,
    queries: mx.array,
    scale: float,
    mask: Any,
    block: int = DEFAULT_BLOCK,
    window: RecentWindow | None = None,
    decode_block: int | None = None,
) -> mx.array:
    """Attention of queries [B, Hq, L, D] over the first `length` stored tokens; the positions
    `window` holds exactly are read from it instead of the codes. `decode_block`: keys per block of
    a decode step (VeloxCache.decode_block), else the codec's (None: one pass)."""
    n_kv_heads = next(iter(store.values())).shape[1]
    codec = codec.for_call(queries, n_kv_heads)
    read = None if window is None else WindowRead(window, length, queries.shape[2])
    decode_block = codec.decode_block if decode_block is None else decode_block
    if queries.shape[2] == 1 and decode_block is None and blockwise.key_block(1, length, block) >= length:
        # a decode step: one pass, the window merged by log-sum-exp (no copy over the context)
        mask_fn = blockwise.as_mask_fn(mask, 1, length)
        return codec.finish(onepass.decode_step(codec, store, length, queries, scale, mask_fn, read))

    spare = packing.capacity(store) - length

    # One pass over every stored token (a decode step, or a chunk within one block) reads the
    # whole buffers: quantized_matmul copies a sliced packed array, and the spare slots past
    # `length` (zeros, or finite trimmed codes) only cost their scores, which are cut off, and
    # weights padded with zeros.
    def scores(q: mx.array, start: int, stop: int) -> mx.array:
        if start == 0 and stop == length:
            return codec.scores(q, store)[..., :length]  # [B, Hkv, R, L, length]
        return codec.scores(q, packing.view(store, start, stop))

    def values(p: mx.array, start: int, stop: int) -> mx.array:
        if start == 0 and stop == length:
            return codec.weighted_values(pad_last(p, spare), store)  # p [B, Hkv, R, L, capacity]
        return codec.weighted_values(p, packing.view(store, start, stop))

    out = blockwise_attention(
        codec.rotate_queries(queries),
        scale,
        n_kv_heads,
        length,
        scores,
        values,
        mask=mask,
        block=block,
        overlay=read,
        decode_block=None if decode_block is None else min(decode_block, block),
    )
    assert out is not None  # value_fn was given
    return codec.finish(out)


def pad_last(x: mx.array, n: int) -> mx.array:
    """x [..., m] with n zeros appended on the last axis."""
    return x if n == 0 else mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n)])


WINDOW_ARRAYS = 3  # a RecentWindow's keys, values and valid slots


def append_window(
    window: RecentWindow | None,
    codec: TokenCodec,
    config: KVCacheConfig,
    keys: mx.array,
    values: mx.array,
    spare: int = 0,
) -> RecentWindow | None:
    """The window after L new tokens [B, H, L, D] (created on the first; None when recent_window
    is 0 or does not apply to the method)."""
    if not config.recent_window or config.method not in WINDOWED:
        return None
    keys, values = codec.window_keys(keys), codec.window_values(values)
    if window is None:
        window = RecentWindow.empty(config.recent_window, keys, values)
    window.append(keys, values, spare)
    return window


class TokenQuantCache(VeloxCache):
    """Per-request cache holding only the codec's per-token arrays."""

    codec_type: type[TokenCodec] = TokenCodec
    step = packing.CAPACITY_STEP

    def __init__(self, config: KVCacheConfig, layer: LayerSpec) -> None:
        super().__init__(config, layer)
        self.codec: TokenCodec | None = None
        self.store: dict[str, mx.array] | None = None  # name -> [B, Hkv, capacity, ...]
        self.window: RecentWindow | None = None  # exact copies of the newest tokens (recent_window > 0)

    @classmethod
    def check_head_dims(cls, config: KVCacheConfig, k_dim: int, v_dim: int) -> None:
        cls.codec_type(config, LayerSpec(0, 1), k_dim, v_dim)  # the codec raises on what it cannot pack

    def _ensure_codec(self, keys: mx.array, values: mx.array) -> TokenCodec:
        if self.codec is None:
            self.codec = self.codec_type(self.config, self.layer, keys.shape[-1], values.shape[-1])
        return self.codec

    def append(self, keys: mx.array, values: mx.array) -> None:
        codec = self._ensure_codec(keys, values)
        encoded = codec.encode(keys, values)
        n_new = keys.shape[2]
        self.store = packing.ensure_capacity(self.store, encoded, self.offset, self.offset + n_new, self.step)
        packing.write(self.store, encoded, self.offset)
        self.offset += n_new
        self.window = append_window(self.window, codec, self.config, keys, values)

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        assert self.codec is not None and self.store is not None  # update_and_fetch appended first
        out = attend_store(
            self.codec, self.store, self.offset, queries, scale, mask, self.block, self.window, self.decode_block
        )
        if self.window is not None:
            self.window.shrink()  # the chunk is read: back to the newest W
        return out

    # --- bookkeeping ---
    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.store is None

    def arrays(self) -> list[mx.array]:
        fixed = self.codec.constants() if self.codec is not None else []
        recent = self.window.arrays() if self.window is not None else []
        return [*(self.store or {}).values(), *fixed, *recent]

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        if self.window is not None:
            self.window.trim(n)
        self._compact()
        return n

    def _compact(self) -> None:
        """Release capacity beyond the step that holds `offset` (copies, so nothing stays pinned)."""
        if self.store is None:
            return
        if self.offset == 0:
            self.store = None
            self.window = None
            return
        keep = packing.round_up(self.offset, self.step)
        if keep < packing.capacity(self.store):
            self.store = packing.owned_view(self.store, 0, keep)

    # --- persistence: (meta, *arrays in codec field order) ---
    def meta_extra(self) -> dict[str, Any]:
        if self.codec is None:
            return {}
        return {"k_dim": self.codec.k_dim, "v_dim": self.codec.v_dim}

    @property
    def state(self) -> tuple:
        if self.store is None or self.codec is None:  # both set by the first append
            return (self.meta,)
        recent = self.window.arrays() if self.window is not None else []
        return (self.meta, *(packing.tokens(self.store[n], 0, self.offset) for n in self.codec.fields), *recent)

    @state.setter
    def state(self, v: tuple) -> None:
        extra = self.restore_meta(v[0])
        self.codec = None
        self.store = None
        if "k_dim" in extra:
            self.codec = self.codec_type(self.config, self.layer, extra["k_dim"], extra["v_dim"])
        self.window = None
        if len(v) > 1:
            n_fields = 0 if self.codec is None else len(self.codec.fields)
            n_window = WINDOW_ARRAYS if self.config.recent_window and self.config.method in WINDOWED else 0
            if self.codec is None or len(v) - 1 != n_fields + n_window:
                raise ValueError(
                    f"{type(self).__name__}: state holds {len(v) - 1} arrays, expected its codec's "
                    f"{n_fields} fields and {n_window} window arrays"
                )
            self.store = dict(zip(self.codec.fields, v[1 : 1 + n_fields]))
            if n_window:
                keys, values, valid = v[1 + n_fields :]
                self.window = RecentWindow(keys, values, valid, reach=self.config.recent_window)
