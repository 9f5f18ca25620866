"""`affine`: per-token affine groups along head_dim, stored as `mx.quantize` triples.

Paper: per-token group quantization as in mlx_lm's QuantizedKVCache; the optional rotation
follows QuaRot (Ashkboos et al., 2024, arXiv 2404.00456): keys and queries are multiplied by the
same randomized Hadamard matrix, which leaves q·k unchanged and spreads outlier channels.
Deviations: values are never rotated (QuaRot rotates them too, with the inverse folded into the
output projection, which would mean editing model weights); the rotation is per layer from
`seed + layer index` rather than one global matrix; keys may use their own bit width (K8V4).
Scales and biases are fp16 whatever the compute dtype: bits/element = bits + 32 / group_size.
Attention reads the packed form directly (quantized_matmul) in key blocks; never exposes an
attribute named `bits` (mlx_lm's attention would take the cache for its own).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import mlx.core as mx

from veloxd.kv.base import Batchable, LayerSpec, register_cache_class
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops import qmm
from veloxd.kv.ops.blockwise import per_kv_head
from veloxd.kv.ops.dequant import dequantize
from veloxd.kv.ops.hadamard import Rotation
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenCodec, TokenQuantCache

METADATA_BITS = 32  # one fp16 scale + one fp16 bias per group
# Query rows per KV head from which a prefill key block is dequantized and multiplied densely: a
# GEMM through quantized_matmul is ~20x slower on CPU than dequantize + matmul, and the dense copy
# is one block's worth. A decode step (L == 1) always reads the packed form (quantized_matmul): it
# reads the whole cache in one pass (veloxd.kv.ops.blockwise), where a dense copy would be the
# whole cache. The choice is made once per attention call from R * L (rows of the whole call),
# never per query block: blockwise_attention sizes query blocks from the local number of query
# heads, so a per-block choice would send the same query row down different arithmetic in one
# process and in a tensor-parallel rank holding a share of the heads (tests/distributed/test_head_split.py).
DENSE_ROWS = 16


def reads_dense(queries: mx.array, n_kv_heads: int) -> bool:
    """Whether an attention call of queries [B, Hq, L, D] multiplies key blocks densely: a prefill
    chunk (L > 1) of R * L >= DENSE_ROWS rows; never a decode step."""
    L = queries.shape[2]
    return L > 1 and queries.shape[1] // n_kv_heads * L >= DENSE_ROWS


def quantize_fp16(x: mx.array, group_size: int, bits: int) -> tuple[mx.array, mx.array, mx.array]:
    """mx.quantize of x's fp16 view, so scales and biases are fp16 even when computing in fp32."""
    return mx.quantize(x.astype(mx.float16), group_size=group_size, bits=bits)


def dequantized(triple: Sequence[mx.array], group_size: int, bits: int, dtype: mx.Dtype) -> mx.array:
    """Dense values of an mx.quantize triple in `dtype` (scales upcast first, as quantized_matmul reads them)."""
    codes, scales, biases = triple
    return dequantize(codes, scales.astype(dtype), biases.astype(dtype), group_size, bits)


def packed_matmul(
    x: mx.array, triple: Sequence[mx.array], transpose: bool, group_size: int, bits: int, dense: bool
) -> mx.array:
    """x [B, Hkv, R, L, K] times a packed [B, Hkv, n, ...] triple (broadcast over R): packed, or
    dequantized when `dense` (decided per attention call by `reads_dense`)."""
    if not dense:
        codes, scales, biases = triple

        def packed(rows: mx.array) -> mx.array:
            return qmm.quantized_matmul(
                rows, codes, scales, biases, transpose=transpose, group_size=group_size, bits=bits
            )

        return per_kv_head(x, packed)
    block = dequantized(triple, group_size, bits, x.dtype)  # [B, Hkv, n, K or N]: one key block
    return per_kv_head(x, lambda rows: rows @ (block.swapaxes(-1, -2) if transpose else block))


class AffineCodec(TokenCodec):
    """Keys and values as (uint32 codes, fp16 scales, fp16 biases), groups along head_dim."""

    fields = ("k_codes", "k_scales", "k_biases", "v_codes", "v_scales", "v_biases")

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, k_dim: int, v_dim: int) -> None:
        super().__init__(config, layer, k_dim, v_dim)
        self.group_size = config.affine_group_size
        self.value_bits = config.bit_width
        self.key_bits = config.affine_key_bits or config.bit_width
        for name, dim in (("key", k_dim), ("value", v_dim)):
            if dim % self.group_size:
                raise ValueError(
                    f"affine_group_size={self.group_size} for method {config.method}: the model's {name} "
                    f"head dimension {dim} is not a multiple of it; choose a group size that divides {dim}"
                )
        self.rotation = Rotation(k_dim, config.seed, layer.index) if config.affine_rotate else None
        self.dense = False  # set per attention call on a copy (for_call)

    def for_call(self, queries: mx.array, n_kv_heads: int) -> AffineCodec:
        call = copy.copy(self)  # shallow: shares the rotation; only `dense` differs
        call.dense = reads_dense(queries, n_kv_heads)
        return call

    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        if self.rotation is not None:
            keys = self.rotation.apply(keys)
        k = quantize_fp16(keys, self.group_size, self.key_bits)
        v = quantize_fp16(values, self.group_size, self.value_bits)
        return dict(zip(self.fields, (*k, *v)))

    def scores(self, q: mx.array, store: dict[str, mx.array]) -> mx.array:
        keys = tuple(store[n] for n in ("k_codes", "k_scales", "k_biases"))  # [B, Hkv, n, ...]
        return packed_matmul(q, keys, True, self.group_size, self.key_bits, self.dense)  # [B, Hkv, R, L, n]

    def weighted_values(self, p: mx.array, store: dict[str, mx.array]) -> mx.array:
        values = tuple(store[n] for n in ("v_codes", "v_scales", "v_biases"))  # [B, Hkv, n, ...]
        return packed_matmul(p, values, False, self.group_size, self.value_bits, self.dense)  # [B, Hkv, R, L, Dv]

    def rotate_queries(self, q: mx.array) -> mx.array:
        return q if self.rotation is None else self.rotation.apply(q)

    def window_keys(self, keys: mx.array) -> mx.array:
        return self.rotate_queries(keys)  # keys meet queries in the same (rotated) frame

    def bits_per_token(self) -> float:
        overhead = METADATA_BITS / self.group_size
        return self.k_dim * (self.key_bits + overhead) + self.v_dim * (self.value_bits + overhead)

    def constants(self) -> list[mx.array]:
        return [] if self.rotation is None else self.rotation.arrays()


@register_cache_class
class AffineCache(Batchable, TokenQuantCache):
    """Per-request affine cache; `merge` batches it as AffineBatchCache."""

    codec_type = AffineCodec


class AffineBatchCache(TokenQuantBatchCache, batches=AffineCache):
    """Several requests' affine caches, left-padded, still packed."""
