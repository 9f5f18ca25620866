"""`kivi`: keys quantized per channel over token groups, values per token, recent tokens exact.

Paper: KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache (Liu, Yuan et al.,
ICML 2024, arXiv 2402.02750). Keys are grouped along tokens (G = kivi_group_size tokens share a
scale/zero per channel), values along channels (G channels per group), asymmetric min/max
integers at 2 or 4 bits, and the newest R = kivi_residual_length tokens stay in full precision.
Keys are stored transposed (K^T packed along tokens) and scored with
quantized_matmul(transpose=False); values with quantized_matmul as usual; no custom kernel.
Deviations: (1) values are quantized together with their keys, whole groups at a time, so a row
keeps R..R+G-1 exact tokens of both (KIVI keeps exactly R values and 0..R-1 keys); (2) scales
and zeros are fp16 (bits/element = bits + 32/G for quantized tokens); (3) a chunk attends to
itself in full precision and is quantized right after its attention, as in KIVI's prefill;
(4) trimming into a quantized group dequantizes the kept part of that group into the window.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from veloxd.kv.base import Batchable, LayerSpec, VeloxCache, register_cache_class
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.quant.kivi_batch import KIVIBatch
from veloxd.kv.quant.kivi_rows import KIVIRows, RowParts, build_rows, check_value_dim


def dtype_named(name: str) -> mx.Dtype:
    return getattr(mx, name.rsplit(".", 1)[-1])


@register_cache_class
class KIVICache(Batchable, VeloxCache):
    """Per-request KIVI cache: one row of KIVIRows; `merge` batches it as a KIVIBatchCache."""

    def __init__(self, config: KVCacheConfig, layer: LayerSpec) -> None:
        super().__init__(config, layer)
        self.rows: KIVIRows | None = None

    @classmethod
    def check_head_dims(cls, config: KVCacheConfig, k_dim: int, v_dim: int) -> None:
        check_value_dim(config, v_dim)

    def append(self, keys: mx.array, values: mx.array) -> None:
        if self.rows is None:
            B, H, _, D = keys.shape
            self.rows = KIVIRows(self.config, D, values.shape[-1], keys.dtype, B, H)
        self.rows.append(keys, values)
        self.offset += keys.shape[2]

    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array:
        assert self.rows is not None  # update_and_fetch appended first
        out = self.rows.attend(queries, scale, mask, own_mask=False, block=self.block, decode_block=self.decode_block)
        self.rows.flush()  # the new tokens were attended exactly; now quantize what left the window
        return out

    # --- bookkeeping ---
    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.rows is None

    def arrays(self) -> list[mx.array]:
        return [] if self.rows is None else self.rows.arrays()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if n == 0:
            return 0
        rows, kept = self.rows, self.offset - n
        assert rows is not None  # offset > 0
        if kept == 0:
            self.rows = None
        elif n <= rows.residual[0]:
            rows.residual[0] -= n
            rows.res_end -= n
        else:
            self.rows = build_rows(self.config, rows.k_dim, rows.v_dim, rows.dtype, rows.heads, [cut_row(rows, kept)])
        self.offset = kept
        return n

    # --- persistence: (meta, k_res, v_res[, K^T triple, V triple]) ---
    def meta_extra(self) -> dict[str, Any]:
        if self.rows is None:
            return {}
        r = self.rows
        return {
            "k_dim": r.k_dim,
            "v_dim": r.v_dim,
            "dtype": str(r.dtype),
            "heads": r.heads,
            "quantized": r.quantized[0],
            "residual": r.residual[0],
        }

    @property
    def state(self) -> tuple:
        if self.rows is None:
            return (self.meta,)
        p = self.rows.row_parts(0)
        return (self.meta, p.k_res, p.v_res, *(p.kq or ()), *(p.vq or ()))

    @state.setter
    def state(self, v: tuple) -> None:
        extra = self.restore_meta(v[0])
        self.rows = None
        if not extra:
            return
        q, r = extra["quantized"], extra["residual"]
        arrays = list(v[1:])
        expected = 2 + (6 if q else 0)
        if len(arrays) != expected:
            raise ValueError(f"KIVICache: state holds {len(arrays)} arrays, expected {expected}")
        kq, vq = (tuple(arrays[2:5]), tuple(arrays[5:8])) if q else (None, None)
        parts = RowParts(q, r, kq, vq, arrays[0], arrays[1])
        self.rows = build_rows(
            self.config, extra["k_dim"], extra["v_dim"], dtype_named(extra["dtype"]), extra["heads"], [parts]
        )


class KIVIBatchCache(KIVIBatch, batches=KIVICache):
    """Several requests' KIVI rows, still packed: what KIVICache.merge returns."""


def cut_row(rows: KIVIRows, kept: int) -> RowParts:
    """Row 0 cut to its first `kept` tokens, where the cut falls inside the quantized part.

    Whole groups before the cut stay packed; the kept tokens of the cut group are dequantized
    (with fp32 scales, as the attention read them) into the residual window.
    """
    G, bits = rows.group, rows.n_bits
    whole = kept // G * G
    full = rows.row_parts(0)
    kq = vq = None
    if whole:
        codes, scales, biases = full.packed()[0]
        kq = (codes[..., : rows.code_cols(whole)], scales[..., : whole // G], biases[..., : whole // G])
        vq = tuple(a[:, :, :whole] for a in full.packed()[1])
    part = kept - whole
    H = rows.heads
    k_part = mx.zeros((1, H, 0, rows.k_dim), rows.dtype)
    v_part = mx.zeros((1, H, 0, rows.v_dim), rows.dtype)
    if part:
        codes, scales, biases = full.packed()[0]
        cols = slice(rows.code_cols(whole), rows.code_cols(whole + G))
        group = slice(whole // G, whole // G + 1)
        k_t = mx.dequantize(
            codes[..., cols],
            scales[..., group].astype(mx.float32),
            biases[..., group].astype(mx.float32),
            group_size=G,
            bits=bits,
        )  # [1, H, D, G]
        k_part = k_t.swapaxes(-1, -2)[:, :, :part].astype(rows.dtype)  # [1, H, part, D]
        codes, scales, biases = (a[:, :, whole:kept] for a in full.packed()[1])
        v_part = mx.dequantize(
            codes, scales.astype(mx.float32), biases.astype(mx.float32), group_size=G, bits=bits
        ).astype(rows.dtype)  # [1, H, part, Dv]
    return RowParts(whole, part, kq, vq, k_part, v_part)
