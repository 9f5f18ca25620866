"""`qjl`: keys as a 1-bit Johnson-Lindenstrauss sign sketch plus their norm; values affine.

Paper: QJL: 1-Bit Quantized JL Transform for KV Cache Quantization with Zero Overhead
(Zandieh, Daliri, Han, 2024, arXiv 2406.03482). A key k is stored as sign(S k) (S: m x d,
iid N(0, 1)) and ||k|| (fp16); the query stays in full precision and
q·k ≈ sqrt(pi/2) / m · ||k|| · <S q, sign(S k)>, an unbiased estimate. A ±1 vector is exactly
a 1-bit affine group (scale 2, bias -1), so scores are one `quantized_matmul` against the packed
signs (the constant scale/bias are broadcast, not stored). Values: per-token affine groups as
in mlx_lm (bits = value bits, fp16 scale and bias per `qjl_value_group_size` elements).
Deviations: no separate sketch for outlier channels, no unquantized initial layers, S is dense
Gaussian per layer from (seed, layer index) rather than one shared matrix, and the key norm is
fp16 rather than fp32. Bits per token and KV head: m + 16 (keys) + Dv·(bits + 32/group) (values).
"""

from __future__ import annotations

import copy
import math

import mlx.core as mx
import numpy as np

from veloxd.kv.base import Batchable, LayerSpec, register_cache_class
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops import bitpack, qmm
from veloxd.kv.ops.blockwise import per_kv_head
from veloxd.kv.ops.dequant import dequantize
from veloxd.kv.quant.affine import packed_matmul, quantize_fp16, reads_dense
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenCodec, TokenQuantCache

NORM_BITS = 16
SKETCH_SALT = 7  # keeps sketch matrices independent of the rotations drawn from the same seed


def gaussian_matrix(rows: int, cols: int, seed: int, layer_index: int, salt: int) -> mx.array:
    """iid N(0, 1) float32 [rows, cols], deterministic in (seed, layer_index, salt)."""
    rng = np.random.default_rng([seed, layer_index, salt])
    return mx.array(rng.standard_normal((rows, cols)).astype(np.float32))


def _broadcast_constant(value: float, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    return mx.broadcast_to(mx.array(value, dtype=dtype), shape)


class SignSketch:
    """sign(S x) packed 1 bit per row of S, and the estimator of q·x from it."""

    def __init__(self, dim: int, sketch_dim: int, seed: int, layer_index: int, salt: int = SKETCH_SALT) -> None:
        if sketch_dim % 32:
            raise ValueError(f"sketch dimension must be a multiple of 32, not {sketch_dim}")
        self.dim = dim
        self.sketch_dim = sketch_dim
        self.matrix = gaussian_matrix(sketch_dim, dim, seed, layer_index, salt)  # S [m, d]
        self.group = 128 if sketch_dim % 128 == 0 else 64 if sketch_dim % 64 == 0 else 32
        self.factor = math.sqrt(math.pi / 2) / sketch_dim

    def project(self, x: mx.array) -> mx.array:
        """S x for x [..., d] -> [..., m] (queries: once per attention call)."""
        return x @ self.matrix.T.astype(x.dtype)

    def encode(self, x: mx.array) -> mx.array:
        """x [..., d] -> packed sign bits uint32 [..., m/32] (bit 1 = positive)."""
        positive = (x.astype(mx.float32) @ self.matrix.T) > 0  # [..., m]
        return bitpack.pack(positive, 1)

    def _affine_form(self, signs: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Packed signs as 1-bit affine groups: (scales 2, biases -1), bit 1 -> +1, bit 0 -> -1."""
        shape = (*signs.shape[:-1], self.sketch_dim // self.group)  # [B, Hkv, n, groups]
        return _broadcast_constant(2.0, shape, dtype), _broadcast_constant(-1.0, shape, dtype)

    def unpacked(self, signs: mx.array, dtype: mx.Dtype) -> mx.array:
        """±1 [B, Hkv, n, m] of one block's packed signs (one block's copy)."""
        scales, biases = self._affine_form(signs, dtype)
        return dequantize(signs, scales, biases, self.group, 1)

    def inner(self, projected: mx.array, signs: mx.array, dense: bool) -> mx.array:
        """<S q, sign(S x)>: projected [B, Hkv, R, L, m], signs [B, Hkv, n, m/32] -> [B, Hkv, R, L, n]."""
        if dense:
            # many rows: MLX's 1-bit quantized_matmul is ~50x slower on CPU than unpacking this
            # block's signs and one dense matmul
            block = self.unpacked(signs, projected.dtype)  # [B, Hkv, n, m]
            return per_kv_head(projected, lambda rows: rows @ block.swapaxes(-1, -2))
        scales, biases = self._affine_form(
            signs, qmm.compute_dtype(projected.dtype)
        )  # a few rows: read the packed signs

        def packed(rows: mx.array) -> mx.array:
            return qmm.quantized_matmul(rows, signs, scales, biases, transpose=True, group_size=self.group, bits=1)

        return per_kv_head(projected, packed)

    def decoded(self, signs: mx.array, norms: mx.array, dtype: mx.Dtype) -> mx.array:
        """A prefill key block's estimator rows [B, Hkv, n, m]: sqrt(pi/2)/m · ||x|| · sign(S x),
        so that <S q, row> is `estimate`'s score (one block's dense copy)."""
        return self.unpacked(signs, dtype) * (norms.astype(dtype) * self.factor)  # norms [B, Hkv, n, 1]

    def estimate(self, projected: mx.array, signs: mx.array, norms: mx.array, dense: bool) -> mx.array:
        """Unbiased q·x from the sketch: sqrt(pi/2)/m · ||x|| · <S q, sign(S x)>; norms [B, Hkv, n, 1]."""
        weight = norms[..., 0].astype(projected.dtype)[:, :, None, None, :] * self.factor  # [B, Hkv, 1, 1, n]
        return self.inner(projected, signs, dense) * weight


class QJLCodec(TokenCodec):
    """Keys: packed sign sketch + fp16 norm. Values: fp16-scaled affine groups."""

    fields = ("k_signs", "k_norms", "v_codes", "v_scales", "v_biases")

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, k_dim: int, v_dim: int) -> None:
        super().__init__(config, layer, k_dim, v_dim)
        self.group_size = config.qjl_value_group_size
        self.value_bits = config.bit_width
        if v_dim % self.group_size:
            raise ValueError(
                f"qjl_value_group_size={self.group_size} for method qjl: the model's value head "
                f"dimension {v_dim} is not a multiple of it; choose a group size that divides {v_dim}"
            )
        if config.qjl_sketch_dim % 32:
            raise ValueError(f"qjl_sketch_dim={config.qjl_sketch_dim} for method qjl: must be a multiple of 32")
        self.sketch = SignSketch(k_dim, config.qjl_sketch_dim, config.seed, layer.index)

    def __deepcopy__(self, memo: dict) -> QJLCodec:
        return self  # immutable after construction: copies of a cache share it

    dense = False  # set per attention call on a copy (for_call), as in affine

    def for_call(self, queries: mx.array, n_kv_heads: int) -> QJLCodec:
        call = copy.copy(self)  # shallow: shares the sketch; only `dense` differs
        call.dense = reads_dense(queries, n_kv_heads)
        return call

    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        norms = mx.linalg.norm(keys.astype(mx.float32), axis=-1, keepdims=True).astype(mx.float16)  # [B, H, L, 1]
        v = quantize_fp16(values, self.group_size, self.value_bits)
        return dict(zip(self.fields, (self.sketch.encode(keys), norms, *v)))

    def rotate_queries(self, q: mx.array) -> mx.array:
        return self.sketch.project(q)  # [B, Hq, L, m]: the sketch side of every score

    def scores(self, q: mx.array, store: dict[str, mx.array]) -> mx.array:
        return self.sketch.estimate(q, store["k_signs"], store["k_norms"], self.dense)

    def weighted_values(self, p: mx.array, store: dict[str, mx.array]) -> mx.array:
        values = tuple(store[n] for n in ("v_codes", "v_scales", "v_biases"))  # [B, Hkv, n, ...]
        return packed_matmul(p, values, False, self.group_size, self.value_bits, self.dense)  # [B, Hkv, R, L, Dv]

    def bits_per_token(self) -> float:
        keys = self.sketch.sketch_dim + NORM_BITS
        values = self.v_dim * (self.value_bits + 32 / self.group_size)
        return keys + values

    def constants(self) -> list[mx.array]:
        return [self.sketch.matrix]


@register_cache_class
class QJLCache(Batchable, TokenQuantCache):
    """Per-request QJL cache; `merge` batches it as QJLBatchCache."""

    codec_type = QJLCodec


class QJLBatchCache(TokenQuantBatchCache, batches=QJLCache):
    """Several requests' qjl caches, left-padded, still packed."""
