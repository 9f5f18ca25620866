"""Eviction over a quantized store: the eviction slots hold affine codes instead of fp16 keys/values.

The eviction engine (veloxd.kv.evict.engine) keeps its layout: every per-slot array has the slot
axis at 2 and is tagged by "positions". `AffineSlots` replaces the "keys"/"values" arrays with
the six arrays of `AffineCodec` (veloxd.kv.quant.affine): uint32 codes [B, Hkv, C, D * bits / 32]
and fp16 scales and biases [B, Hkv, C, D / group] for keys and for values. Affine quantizes
each token on its own (groups run along the head dimension), so a slot is self-contained:
compaction, a decode write into a free slot, batching and extraction are gathers and scatters of
rows of these arrays, exactly as for fp16 slots, and no token's codes depend on another's.
Attention reads the codes one key block at a time through the affine primitives
(`packed_matmul`: quantized_matmul for decode, one dequantized block for prefill, chosen once
per attention call as `affine` chooses), inside
veloxd.kv.ops.blockwise, so the cache is never dequantized whole. The policies' scores are
unchanged: they come from the same attention pass over the quantized keys (knorm: the norms of
the keys before quantization). SnapKV holds a prompt whole until it ends: here as codes.

Papers: the policies' own (SnapKV, Li et al., 2024, arXiv 2404.14469; H2O, TOVA, K-norm,
StreamingLLM: see their modules); the storage is per-token group quantization as in mlx's
`mx.quantize` and mlx_lm's QuantizedKVCache.
`affine_rotate` applies affine's randomized Hadamard rotation (QuaRot, Ashkboos et al., 2024,
arXiv 2404.00456) to keys before quantization, and to every query where it meets the codes.
Deviations: SnapKV and the others score and evict full-precision caches; here the tokens a step
appends are quantized before the step attends to them (as `affine` does) and the scores come
from the quantized keys, so a token's quantization error can change which tokens are kept.

KIVI is not offered as a storage: it quantizes keys per channel over groups of G consecutive
tokens (one scale per channel and group), so evicting one token, or writing a decode token into
a freed slot, would mean requantizing its whole group; its slots are not independent rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from veloxd.kv.base import LayerSpec
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.evict.attention import Keys, Values
from veloxd.kv.evict.engine import EvictionCache
from veloxd.kv.quant.affine import AffineCodec

KEY_FIELDS = ("k_codes", "k_scales", "k_biases")
VALUE_FIELDS = ("v_codes", "v_scales", "v_biases")


@dataclass(frozen=True)
class AffineKeys:
    """The keys of the first `length` slots as codes; scores of one block at a time."""

    codec: AffineCodec
    arrays: dict[str, mx.array]  # KEY_FIELDS -> [B, Hkv, C, ...]
    length: int

    @property
    def shape(self) -> tuple[int, int, int]:
        B, n_kv_heads = self.arrays["k_codes"].shape[:2]
        return B, n_kv_heads, self.length

    def scores(self, q: mx.array, start: int, stop: int) -> mx.array:
        whole = start == 0 and stop == self.length  # one pass: whole buffers (see AffineValues)
        block = self.arrays if whole else {n: a[:, :, start:stop] for n, a in self.arrays.items()}  # [B, Hkv, n, ...]
        # Rotated keys (affine_rotate) need rotated queries. Rotating here, per key block, covers every
        # query a policy scores with (the step's, SnapKV's stash, TOVA's last) at ~log2(D)/block of
        # the block's matmul, instead of a rotation at each call site.
        return self.codec.scores(self.codec.rotate_queries(q), block)[..., : stop - start]  # [B, Hkv, R, Lq, n]


@dataclass(frozen=True)
class AffineValues:
    """The values of the slots as codes; p @ values one block at a time (the keys bound the length)."""

    codec: AffineCodec
    arrays: dict[str, mx.array]  # VALUE_FIELDS -> [B, Hkv, C, ...]
    length: int

    def weighted(self, p: mx.array, start: int, stop: int) -> mx.array:
        if start == 0 and stop == self.length:
            # One pass over every slot reads the whole buffers: quantized_matmul copies a sliced
            # packed array; the spare slots get zero weight.
            spare = self.arrays["v_codes"].shape[2] - stop
            weights = p if spare == 0 else mx.pad(p, [(0, 0)] * (p.ndim - 1) + [(0, spare)])  # [.., C]
            return self.codec.weighted_values(weights, self.arrays)
        block = {n: a[:, :, start:stop] for n, a in self.arrays.items()}  # [B, Hkv, n, ...]
        return self.codec.weighted_values(p, block)  # [B, Hkv, R, Lq, Dv]


class AffineSlots(EvictionCache):
    """Mixed in front of a policy class: `class SnapKVAffineCache(AffineSlots, SnapKVCache)`."""

    _codec: AffineCodec | None = None  # built on the first append (or from restored slots)
    _call: AffineCodec | None = None  # during attend: the codec with this call's packed/dense choice

    @classmethod
    def check_head_dims(cls, config: KVCacheConfig, k_dim: int, v_dim: int) -> None:
        AffineCodec(config, LayerSpec(0, 1), k_dim, v_dim)  # raises on a group size the heads do not divide

    def codec(self) -> AffineCodec:
        if self._codec is None:
            # Head dimensions from the stored scales (one per group): exact for restored or merged slots.
            k_dim = self.slots["k_scales"].shape[-1] * self.config.affine_group_size
            v_dim = self.slots["v_scales"].shape[-1] * self.config.affine_group_size
            self._codec = AffineCodec(self.config, self.layer, k_dim, v_dim)
        return self._codec

    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        if self._codec is None:
            self._codec = AffineCodec(self.config, self.layer, keys.shape[-1], values.shape[-1])
        return self._codec.encode(keys, values)  # six arrays [B, Hkv, L, ...]

    def arrays(self) -> list[mx.array]:
        """The slots and rows, plus the codec's rotation (signs; a [D, D] matrix when D is not a power of two)."""
        return [*super().arrays(), *(self._codec.constants() if self._codec is not None else [])]

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        # Packed (quantized_matmul) or dense (one dequantized block) is chosen once from the whole
        # call's R * L, as `affine` does (a per-query-block choice would differ between one process
        # and a tensor-parallel rank); every score of the call uses it, SnapKV's stash included.
        self._call = self.codec().for_call(queries, self.slots["k_codes"].shape[1])
        try:
            return super().attend(queries, scale, mask)
        finally:
            self._call = None

    def operands(self, n: int | None = None) -> tuple[Keys, Values]:
        codec = self._call or self.codec()
        length = self.width if n is None else n
        keys = AffineKeys(codec, {f: self.slots[f] for f in KEY_FIELDS}, length)
        return keys, AffineValues(codec, {f: self.slots[f] for f in VALUE_FIELDS}, length)
