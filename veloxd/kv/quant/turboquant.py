"""`turboquant_mse` and `turboquant_prod`: rotated vectors, scalar codebook codes, one gain each.

Paper: TurboQuant: Online Vector Quantization with Near-optimal Distortion Rate (Zandieh,
Daliri, Hadian, Mirrokni, 2025, arXiv 2504.19874).
- mse: x -> R x (randomized Hadamard from seed and layer index); each coordinate of the unit
  vector R x / ||x|| is stored as the index of its nearest level in the Lloyd-Max codebook of
  the rotated-coordinate law (veloxd.kv.ops.codebooks), packed at exactly b bits, plus one fp16 gain
  per vector. Keys and values alike (own rotations); queries are rotated once per call and the
  attention output rotated back once.
- prod: keys as mse at b-1 bits plus a 1-bit QJL sketch sign(S r) (S: d x d Gaussian) of the
  residual r and ||r|| (fp16); q·k ≈ q·k_mse + sqrt(pi/2)/d · ||r|| · <S q, sign(S r)> is
  unbiased. Values as mse at b bits.
Deviations: the rotation is a randomized Hadamard, not a dense random orthogonal matrix; the
gain is ||x|| / ||decoded unit vector|| (norm re-correction as in llama.cpp #21817: decoded
vectors keep their norm; lower KL on the tiny model at 2-4 bits) where the paper stores ||x||;
the paper's outlier split (channels found before rotation, each set rotated and quantized
separately) is replaced by `turboquant_outlier_channels` = the first k *rotated* channels getting
one more bit (k a multiple of 32). `turboquant_codebook: uniform` swaps the Lloyd-Max levels for
the best evenly spaced levels of the same law so attention runs as a native quantized_matmul
(faster on CPU, slightly higher distortion); Lloyd-Max attention decodes codes to levels chunk
by chunk with one fused kernel and multiplies (veloxd.kv.ops.levels).
Bits per element: b + k/d + 16/d (mse); keys (b-1) + 1 + k/d + 32/d for prod. Head dimensions
must be multiples of 32 (codes are packed in 32-bit words).
"""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np

from veloxd.kv.base import Batchable, LayerSpec, register_cache_class
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops import bitpack, qmm
from veloxd.kv.ops.blockwise import per_kv_head
from veloxd.kv.ops.codebooks import codebook
from veloxd.kv.ops.dequant import dequantize
from veloxd.kv.ops.hadamard import Rotation
from veloxd.kv.ops.levels import LevelCodes
from veloxd.kv.quant.affine import reads_dense
from veloxd.kv.quant.qjl import SignSketch
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenCodec, TokenQuantCache

NORM_BITS = 16
# Keys per decode block of Lloyd-Max codes: one full levels chunk, as many keys as a prefill block
# decodes at once (the same transient bound); 256-key blocks made an 8k decode step ~1.3x slower.
LLOYD_DECODE_BLOCK = 1024
KEY_SALT, VALUE_SALT, RESIDUAL_SALT = 0, 1, 2


class Part:
    """One channel range [start, stop) of rotated unit vectors, coded with one codebook."""

    def __init__(self, field: str, start: int, stop: int, dim: int, bits: int, kind: str) -> None:
        self.start, self.stop, self.bits, self.kind = start, stop, bits, kind
        self.width = stop - start
        self.book = codebook(kind, dim, bits)
        self.lloyd = LevelCodes(self.book.levels, bits, self.width) if kind == "lloyd_max" else None
        self.fields = self.lloyd.names(field) if self.lloyd else (field,)
        self.thresholds = mx.array(self.book.thresholds.astype("float32"))
        self.steps = mx.array(np.diff(self.book.levels).astype("float32"))  # level i+1 - level i

    def encode(self, unit: mx.array) -> tuple[dict[str, mx.array], mx.array]:
        """unit [..., d] -> (packed arrays by field, the levels [..., width] they decode to)."""
        above = unit[..., self.start : self.stop, None] > self.thresholds  # [..., width, 2^b - 1]
        codes = above.sum(axis=-1).astype(mx.uint32)  # [..., width]: index of the nearest level
        levels = (above * self.steps).sum(axis=-1) + float(self.book.levels[0])  # no gather needed
        packed = self.lloyd.pack(codes) if self.lloyd else [bitpack.pack(codes, self.bits)]
        return dict(zip(self.fields, packed)), levels

    def dot(self, q: mx.array, store: dict[str, mx.array]) -> mx.array:
        """q [B, Hkv, R, L, d] · this range's levels -> [B, Hkv, R, L, n], read from the codes."""
        q = q[..., self.start : self.stop]
        if self.lloyd:
            return self.lloyd.dot(q, [store[f] for f in self.fields])
        return self._qmm(q, store[self.fields[0]], transpose=True)

    def weighted(self, p: mx.array, store: dict[str, mx.array]) -> mx.array:
        """p [B, Hkv, R, L, n] @ this range's levels -> [B, Hkv, R, L, width], read from the codes."""
        if self.lloyd:
            return self.lloyd.weighted(p, [store[f] for f in self.fields])
        return self._qmm(p, store[self.fields[0]], transpose=False)

    def levels(self, store: dict[str, mx.array], dtype: mx.Dtype) -> mx.array:
        """This range's levels of a key block [B, Hkv, n, width] (a prefill block's dense copy)."""
        if self.lloyd:
            return self.lloyd.block_levels([store[f] for f in self.fields], dtype)
        packed = store[self.fields[0]]
        scales, biases, group = self._affine_form(packed, dtype)
        return dequantize(packed, scales, biases, group, self.bits)  # [B, Hkv, n, width]

    def _affine_form(self, packed: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array, int]:
        """Evenly spaced levels are affine in the code: (scales = step, biases = lowest level, group
        size), constants broadcast over the packed [B, Hkv, n, words] codes."""
        group = bitpack.native_group(self.width)
        shape = (*packed.shape[:-1], self.width // group)  # [B, Hkv, n, groups]
        scales = mx.broadcast_to(mx.array(self.book.step, dtype=dtype), shape)
        biases = mx.broadcast_to(mx.array(float(self.book.levels[0]), dtype=dtype), shape)
        return scales, biases, group

    def _qmm(self, x: mx.array, packed: mx.array, transpose: bool) -> mx.array:
        """x times this range's uniform levels, read packed (a prefill block is dequantized instead:
        RotatedQuantizer.decoded, as a GEMM through quantized_matmul is ~8x slower on CPU)."""
        scales, biases, group = self._affine_form(packed, qmm.compute_dtype(x.dtype))

        def matmul(rows: mx.array) -> mx.array:
            return qmm.quantized_matmul(
                rows, packed, scales, biases, transpose=transpose, group_size=group, bits=self.bits
            )

        return per_kv_head(x, matmul)


class RotatedQuantizer:
    """TurboQuant-mse of one tensor kind: codes per channel part plus one fp16 gain per vector."""

    def __init__(self, prefix: str, dim: int, bits: int, outliers: int, kind: str) -> None:
        if outliers and (outliers % 32 or outliers >= dim):
            raise ValueError(
                f"turboquant_outlier_channels={outliers}: must be a multiple of 32 below the head dimension {dim}"
            )
        ranges = [(f"{prefix}outlier_codes", 0, outliers, bits + 1), (f"{prefix}codes", outliers, dim, bits)]
        self.parts = [Part(f, a, b, dim, n, kind) for f, a, b, n in ranges if b > a]
        self.gain_field = f"{prefix}gains"
        self.dim, self.bits, self.outliers = dim, bits, outliers

    @property
    def fields(self) -> tuple[str, ...]:
        return (*(f for p in self.parts for f in p.fields), self.gain_field)

    def encode(self, x: mx.array) -> tuple[dict[str, mx.array], mx.array]:
        """Rotated x [..., d] -> (stored arrays, reconstruction [..., d] the decoder will see)."""
        norms = mx.linalg.norm(x, axis=-1, keepdims=True)  # [..., 1]
        unit = x / mx.maximum(norms, 1e-30)
        stored: dict[str, mx.array] = {}
        part_levels: list[mx.array] = []
        for part in self.parts:
            packed, one_part = part.encode(unit)
            stored.update(packed)
            part_levels.append(one_part)
        levels = mx.concatenate(part_levels, axis=-1)  # [..., d]: the decoded unit vector, norm ~ sqrt(1 - D)
        # Norm re-correction: scale so the decoded vector has x's norm (never 0: no level is 0).
        gains = (norms / mx.linalg.norm(levels, axis=-1, keepdims=True)).astype(mx.float16)  # [..., 1]
        stored[self.gain_field] = gains
        return stored, levels * gains.astype(x.dtype)

    def scores(self, q: mx.array, store: dict[str, mx.array], dense: bool) -> mx.array:
        """q_rot [B, Hkv, R, L, d] -> gain_k · q_rot·levels_k: [B, Hkv, R, L, n]."""
        if dense:
            block = self.decoded(store, q.dtype)  # [B, Hkv, n, d]
            return per_kv_head(q, lambda rows: rows @ block.swapaxes(-1, -2))
        dots = [part.dot(q, store) for part in self.parts]
        total = dots[0] if len(dots) == 1 else sum(dots[1:], dots[0])
        return total * self._gains(store, q.dtype)

    def weighted(self, p: mx.array, store: dict[str, mx.array], dense: bool) -> mx.array:
        """p [B, Hkv, R, L, n] -> sum_t p_t gain_t levels_t: [B, Hkv, R, L, d] (rotated frame)."""
        if dense:
            block = self.decoded(store, p.dtype)  # [B, Hkv, n, d]
            return per_kv_head(p, lambda rows: rows @ block)
        scaled = p * self._gains(store, p.dtype)
        return mx.concatenate([part.weighted(scaled, store) for part in self.parts], axis=-1)

    def decoded(self, store: dict[str, mx.array], dtype: mx.Dtype) -> mx.array:
        """A prefill key block's vectors [B, Hkv, n, d], gains applied: scaling the block (n x d)
        instead of the scores or weights (R x L x n per KV head) saves a pass over the largest
        arrays of a dense prefill block."""
        parts = [part.levels(store, dtype) for part in self.parts]
        levels = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)  # [B, Hkv, n, d]
        return levels * store[self.gain_field].astype(dtype)  # gains [B, Hkv, n, 1]

    def _gains(self, store: dict[str, mx.array], dtype: mx.Dtype) -> mx.array:
        return store[self.gain_field][..., 0].astype(dtype)[:, :, None, None, :]  # [B, Hkv, 1, 1, n]

    def bits_per_vector(self) -> float:
        return self.dim * self.bits + self.outliers + NORM_BITS

    def constants(self) -> list[mx.array]:
        return [a for part in self.parts for a in (part.thresholds, part.steps)]


class TurboQuantMSECodec(TokenCodec):
    """Keys and values: rotated, normalized, coded with the codebook; attention in the rotated frame."""

    key_bits_offset = 0  # prod stores its keys at one bit less

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, k_dim: int, v_dim: int) -> None:
        super().__init__(config, layer, k_dim, v_dim)
        for name, dim in (("key", k_dim), ("value", v_dim)):
            if dim % 32:
                raise ValueError(
                    f"method {config.method} packs codes in 32-bit words: the model's {name} head "
                    f"dimension {dim} is not a multiple of 32"
                )
        outliers, kind = config.turboquant_outlier_channels, config.turboquant_codebook
        self.key_rotation = Rotation(k_dim, config.seed, layer.index, KEY_SALT)
        self.value_rotation = Rotation(v_dim, config.seed, layer.index, VALUE_SALT)
        key_bits = config.turboquant_key_bits or config.bit_width
        self.keys = RotatedQuantizer("k_", k_dim, key_bits - self.key_bits_offset, outliers, kind)
        self.values = RotatedQuantizer("v_", v_dim, config.bit_width, outliers, kind)
        self.fields = (*self.keys.fields, *self.values.fields)
        # Lloyd-Max levels are decoded (one fused kernel) before a dense matmul: a decode step
        # reads them a bounded block at a time, not the whole cache decoded at once.
        self.decode_block = LLOYD_DECODE_BLOCK if kind == "lloyd_max" else None

    def __deepcopy__(self, memo: dict) -> TurboQuantMSECodec:
        return self  # immutable after construction: copies of a cache share it

    dense = False  # set per attention call on a copy (for_call), as in affine

    def for_call(self, queries: mx.array, n_kv_heads: int) -> TurboQuantMSECodec:
        call = copy.copy(self)  # shallow: shares rotations (and prod's sketch); only `dense` differs
        call.dense = reads_dense(queries, n_kv_heads)
        return call

    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        k_stored, _ = self.keys.encode(self.key_rotation.apply(keys.astype(mx.float32)))
        v_stored, _ = self.values.encode(self.value_rotation.apply(values.astype(mx.float32)))
        return {**k_stored, **v_stored}

    def rotate_queries(self, q: mx.array) -> mx.array:
        return self.key_rotation.apply(q)

    def window_keys(self, keys: mx.array) -> mx.array:
        return self.key_rotation.apply(keys)

    def window_values(self, values: mx.array) -> mx.array:
        return self.value_rotation.apply(values)  # `finish` rotates the whole output back

    def scores(self, q: mx.array, store: dict[str, mx.array]) -> mx.array:
        return self.keys.scores(q, store, self.dense)

    def weighted_values(self, p: mx.array, store: dict[str, mx.array]) -> mx.array:
        return self.values.weighted(p, store, self.dense)

    def finish(self, out: mx.array) -> mx.array:
        return self.value_rotation.invert(out)  # once per call: back from the values' rotated frame

    def bits_per_token(self) -> float:
        return self.keys.bits_per_vector() + self.values.bits_per_vector()

    def constants(self) -> list[mx.array]:
        rotations = [*self.key_rotation.arrays(), *self.value_rotation.arrays()]
        return [*rotations, *self.keys.constants(), *self.values.constants()]


class TurboQuantProdCodec(TurboQuantMSECodec):
    """Keys: mse at bits-1 plus a 1-bit QJL sketch of the residual and its norm (unbiased q·k)."""

    key_bits_offset = 1

    def __init__(self, config: KVCacheConfig, layer: LayerSpec, k_dim: int, v_dim: int) -> None:
        super().__init__(config, layer, k_dim, v_dim)
        self.sketch = SignSketch(k_dim, k_dim, config.seed, layer.index, RESIDUAL_SALT)
        self.fields = (*self.keys.fields, "k_residual_signs", "k_residual_norms", *self.values.fields)

    def encode(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        rotated = self.key_rotation.apply(keys.astype(mx.float32))
        k_stored, recon = self.keys.encode(rotated)
        residual = rotated - recon  # [B, H, L, d]: what the mse code missed
        r_norms = mx.linalg.norm(residual, axis=-1, keepdims=True).astype(mx.float16)  # [B, H, L, 1]
        v_stored, _ = self.values.encode(self.value_rotation.apply(values.astype(mx.float32)))
        sketch = {"k_residual_signs": self.sketch.encode(residual), "k_residual_norms": r_norms}
        return {**k_stored, **sketch, **v_stored}

    def rotate_queries(self, q: mx.array) -> mx.array:
        rotated = self.key_rotation.apply(q)
        return mx.concatenate([rotated, self.sketch.project(rotated)], axis=-1)  # [B, Hq, L, d + d]

    def scores(self, q: mx.array, store: dict[str, mx.array]) -> mx.array:
        d = self.k_dim
        signs, norms = store["k_residual_signs"], store["k_residual_norms"]
        if self.dense:  # one matmul of q [rotated | sketched] against the block's [mse | sketch] rows
            rows = [self.keys.decoded(store, q.dtype), self.sketch.decoded(signs, norms, q.dtype)]
            block = mx.concatenate(rows, axis=-1)  # [B, Hkv, n, d + d]
            return per_kv_head(q, lambda x: x @ block.swapaxes(-1, -2))
        mse = self.keys.scores(q[..., :d], store, self.dense)
        return mse + self.sketch.estimate(q[..., d:], signs, norms, self.dense)

    def bits_per_token(self) -> float:
        return super().bits_per_token() + self.k_dim + NORM_BITS

    def constants(self) -> list[mx.array]:
        return [*super().constants(), self.sketch.matrix]


@register_cache_class
class TurboQuantMSECache(Batchable, TokenQuantCache):
    """Per-request turboquant_mse cache; `merge` batches it as TurboQuantMSEBatchCache."""

    codec_type = TurboQuantMSECodec


class TurboQuantMSEBatchCache(TokenQuantBatchCache, batches=TurboQuantMSECache):
    """Several requests' turboquant_mse caches, left-padded, still packed."""


@register_cache_class
class TurboQuantProdCache(Batchable, TokenQuantCache):
    """Per-request turboquant_prod cache; `merge` batches it as TurboQuantProdBatchCache."""

    codec_type = TurboQuantProdCodec


class TurboQuantProdBatchCache(TokenQuantBatchCache, batches=TurboQuantProdCache):
    """Several requests' turboquant_prod caches, left-padded, still packed."""
