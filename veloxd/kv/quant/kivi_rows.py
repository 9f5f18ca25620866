"""KIVI storage for B rows and attention over it (used by KIVICache with B=1 and KIVIBatchCache).

Layout per row b (tokens in order 0..n_b):
- quantized groups, left-aligned: keys transposed, K^T [B, H, D, Qcap] packed along tokens (one
  fp16 scale/bias per channel per G tokens); values per token, [B, H, Qcap, Dv] packed along
  channels. Row b holds `quantized[b]` tokens (a multiple of G); slots beyond are holes.
- a full-precision residual, right-aligned like mlx_lm's BatchKVCache: slots
  [res_end - residual[b], res_end) of K_res/V_res [B, H, C, D] hold row b's newest tokens.
Appends write at res_end (one slice for all rows). After attention, `flush` moves whole groups
of the oldest residual tokens into the quantized part once a row's residual reaches R + G
(R = kivi_residual_length), so between steps each row keeps R..R+G-1 tokens in full precision.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops import packing
from veloxd.kv.ops.blockwise import blockwise_attention, per_kv_head
from veloxd.kv.quant.affine import packed_matmul, quantize_fp16, reads_dense


def check_value_dim(config: KVCacheConfig, v_dim: int) -> None:
    if v_dim % config.kivi_group_size:
        raise ValueError(
            f"kivi_group_size={config.kivi_group_size} for method kivi: the model's value head dimension "
            f"{v_dim} is not a multiple of it (values are grouped along channels)"
        )


class KIVIRows:
    """Packed KIVI keys/values plus the full-precision window, for B rows."""

    def __init__(self, config: KVCacheConfig, k_dim: int, v_dim: int, dtype: mx.Dtype, batch: int, heads: int) -> None:
        self.config = config
        self.n_bits = config.bit_width  # on the rows, never on a cache: mlx_lm keys off `cache.bits`
        self.group = config.kivi_group_size
        self.window = config.kivi_residual_length
        check_value_dim(config, v_dim)
        self.k_dim, self.v_dim, self.heads = k_dim, v_dim, heads
        self.quantized = [0] * batch
        self.residual = [0] * batch
        self.kq: tuple[mx.array, ...] | None = None  # K^T codes [B,H,D,Qcap*b/32], scales/biases [B,H,D,Qcap/G]
        self.vq: tuple[mx.array, ...] | None = None  # V codes [B,H,Qcap,Dv*b/32], scales/biases [B,H,Qcap,Dv/G]
        cap = self.res_capacity()
        self.k_res = mx.zeros((batch, heads, cap, k_dim), dtype)  # [B, H, C, D]
        self.v_res = mx.zeros((batch, heads, cap, v_dim), dtype)  # [B, H, C, Dv]
        self.res_end = 0
        self.hold = False  # True while a right-padded chunk is pending: its tail is garbage

    @property
    def dtype(self) -> mx.Dtype:
        """Compute dtype of the full-precision window (not stored: mx.Dtype does not deepcopy)."""
        return self.k_res.dtype

    # --- sizes ---
    def res_capacity(self, needed: int = 0) -> int:
        """Residual slots kept: the window plus one group to collect; batches keep one more group
        of slack so rows flushing at different steps do not force a compaction every step."""
        groups = 1 if self.batch == 1 else 2
        return max(self.window + groups * self.group, needed)

    @property
    def batch(self) -> int:
        return len(self.quantized)

    def q_capacity(self) -> int:
        return 0 if self.kq is None else self.kq[1].shape[-1] * self.group

    def packed(self) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]]:
        """(K^T triple, V triple): there once any row holds a quantized token."""
        if self.kq is None or self.vq is None:
            raise RuntimeError("KIVI rows hold no quantized tokens yet")
        return self.kq, self.vq

    def lengths(self) -> list[int]:
        return [q + r for q, r in zip(self.quantized, self.residual)]

    def code_cols(self, n_tokens: int) -> int:
        return n_tokens * self.n_bits // 32

    def arrays(self) -> list[mx.array]:
        return [*(self.kq or ()), *(self.vq or ()), self.k_res, self.v_res]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    # --- writing ---
    def append(self, keys: mx.array, values: mx.array) -> None:
        """keys [B, H, L, D], values [B, H, L, Dv]: the newest tokens of every row."""
        if not self.hold:
            self.flush()
        n_new = keys.shape[2]
        if self.res_end + n_new > self.k_res.shape[2]:
            self.compact_residual(n_new)
        self.k_res[:, :, self.res_end : self.res_end + n_new] = keys.astype(self.dtype)
        self.v_res[:, :, self.res_end : self.res_end + n_new] = values.astype(self.dtype)
        self.res_end += n_new
        self.residual = [r + n_new for r in self.residual]

    def compact_residual(self, extra: int = 0) -> None:
        """Copy the live residual span to the front of a fresh buffer with room for `extra` more."""
        live = max(self.residual, default=0)
        start = self.res_end - live
        cap = self.res_capacity(live + extra)
        k = mx.zeros((self.batch, self.heads, cap, self.k_dim), self.dtype)  # [B, H, C, D]
        v = mx.zeros((self.batch, self.heads, cap, self.v_dim), self.dtype)  # [B, H, C, Dv]
        if live:
            k[:, :, :live] = self.k_res[:, :, start : self.res_end]
            v[:, :, :live] = self.v_res[:, :, start : self.res_end]
        self.k_res, self.v_res, self.res_end = k, v, live

    def ensure_q_capacity(self, needed: int) -> None:
        if needed <= self.q_capacity():
            return
        cap = packing.round_up(needed, packing.CAPACITY_STEP)
        B, H, G = self.batch, self.heads, self.group
        fresh_k = (  # K^T: tokens on the last axis
            mx.zeros((B, H, self.k_dim, self.code_cols(cap)), mx.uint32),
            mx.zeros((B, H, self.k_dim, cap // G), mx.float16),
            mx.zeros((B, H, self.k_dim, cap // G), mx.float16),
        )
        fresh_v = (  # V: tokens on axis 2
            mx.zeros((B, H, cap, self.code_cols(self.v_dim)), mx.uint32),
            mx.zeros((B, H, cap, self.v_dim // G), mx.float16),
            mx.zeros((B, H, cap, self.v_dim // G), mx.float16),
        )
        if self.kq is not None and self.vq is not None:  # set together
            old = self.q_capacity()
            for new, cur in zip(fresh_k, self.kq):
                new[..., : cur.shape[-1]] = cur
            for new, cur in zip(fresh_v, self.vq):
                new[:, :, :old] = cur
        self.kq, self.vq = fresh_k, fresh_v

    def flush(self) -> None:
        """Quantize whole groups of each row's oldest residual tokens beyond the window."""
        G = self.group
        moves = [max(0, (r - self.window) // G * G) for r in self.residual]
        if not any(moves):
            return
        self.ensure_q_capacity(max(q + m for q, m in zip(self.quantized, moves)))
        kq, vq = self.packed()
        for b, n in enumerate(moves):
            if n == 0:
                continue
            q, start = self.quantized[b], self.res_end - self.residual[b]
            keys_t = self.k_res[b : b + 1, :, start : start + n].swapaxes(-1, -2)  # [1, H, D, n]
            codes, scales, biases = quantize_fp16(keys_t, G, self.n_bits)  # along tokens, per channel
            c0, g0 = self.code_cols(q), q // G
            kq[0][b : b + 1, ..., c0 : c0 + codes.shape[-1]] = codes
            kq[1][b : b + 1, ..., g0 : g0 + scales.shape[-1]] = scales
            kq[2][b : b + 1, ..., g0 : g0 + biases.shape[-1]] = biases
            for dst, src in zip(vq, quantize_fp16(self.v_res[b : b + 1, :, start : start + n], G, self.n_bits)):
                dst[b : b + 1, :, q : q + n] = src
            self.quantized[b] += n
            self.residual[b] -= n
        if self.k_res.shape[2] > self.res_capacity():
            self.compact_residual()  # drop what a long prompt chunk left behind

    # --- attention ---
    def attend(
        self, queries: mx.array, scale: float, mask: Any, own_mask: bool, block: int, decode_block: int | None
    ) -> mx.array:
        """queries [B, Hq, L, D] are the newest L residual tokens of every row (`decode_block`:
        veloxd.kv.ops.blockwise.key_block).

        own_mask=False: `mask` (None / "causal" / array) applies as given (B=1: no holes).
        own_mask=True: holes and causality come from the per-row counts; `mask` is ignored.
        """
        L = queries.shape[2]
        dense = reads_dense(queries, self.heads)  # once per call, not per query block (see affine)
        # A pass over every quantized token reads the whole packed buffers: quantized_matmul copies
        # a sliced packed array. The spare capacity past q_used holds zeros or finite stale codes:
        # their scores are cut off and their weights are zero.
        q_used = max(self.quantized)  # a multiple of G
        live = max(self.residual)
        r_start = self.res_end - live
        length = q_used + live
        quantized = mx.array(self.quantized)
        hole_end = mx.array([self.res_end - r for r in self.residual])

        def keep(qs: int, qe: int, start: int, stop: int) -> mx.array:
            Lq = qe - qs
            parts = []
            if start < q_used:
                slots = mx.arange(start, min(stop, q_used))
                filled = slots[None] < quantized[:, None]  # [B, n_q]: beyond quantized[b] is a hole
                parts.append(mx.broadcast_to(filled[:, None], (self.batch, Lq, slots.size)))  # [B, Lq, n_q]
            if stop > q_used:
                slots = mx.arange(max(start, q_used), stop) - q_used + r_start  # residual slot index
                live_slot = slots[None, None] >= hole_end[:, None, None]  # [B, 1, n_r]
                causal = slots[None] <= (self.res_end - L + mx.arange(qs, qe))[:, None]  # [Lq, n_r]
                parts.append(live_slot & causal[None])  # [B, Lq, n_r]
            return mx.concatenate(parts, axis=-1)[:, None, None]  # [B, 1, 1, Lq, n]

        def score_fn(q: mx.array, start: int, stop: int) -> mx.array:
            parts = []
            if start == 0 and stop >= q_used > 0:  # every quantized token: the whole buffers (see below)
                scores = packed_matmul(q, self.packed()[0], False, self.group, self.n_bits, dense)
                parts.append(scores[..., :q_used])  # [B, Hkv, R, L, q_used]
            elif start < q_used:
                cols = slice(self.code_cols(start), self.code_cols(min(stop, q_used)))
                groups = slice(start // self.group, min(stop, q_used) // self.group)
                codes, scales, biases = self.packed()[0]
                keys_t = (codes[..., cols], scales[..., groups], biases[..., groups])  # K^T block [B, H, D, ..]
                parts.append(packed_matmul(q, keys_t, False, self.group, self.n_bits, dense))  # [B, Hkv, R, L, n_q]
            if stop > q_used:
                a, b = max(start, q_used) - q_used + r_start, stop - q_used + r_start
                k_t = self.k_res[:, :, a:b].swapaxes(-1, -2).astype(q.dtype)  # [B, H, D, n_r]
                parts.append(per_kv_head(q, lambda rows: rows @ k_t))
            return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)  # [B, Hkv, R, Lq, n]

        def value_fn(p: mx.array, start: int, stop: int) -> mx.array:
            out = None
            split = max(0, min(stop, q_used) - start)
            if start == 0 and split == q_used > 0:  # every quantized token: the whole buffers
                spare = self.q_capacity() - q_used
                weights = mx.pad(p[..., :split], [(0, 0)] * (p.ndim - 1) + [(0, spare)])  # [.., Qcap]
                out = packed_matmul(weights, self.packed()[1], False, self.group, self.n_bits, dense)
            elif split:
                values = tuple(a[:, :, start : start + split] for a in self.packed()[1])  # [B, H, n_q, ..]
                out = packed_matmul(p[..., :split], values, False, self.group, self.n_bits, dense)  # [B, Hkv, R, L, Dv]
            if stop > q_used:
                a, b = max(start, q_used) - q_used + r_start, stop - q_used + r_start
                v = self.v_res[:, :, a:b].astype(p.dtype)  # [B, H, n_r, Dv]
                res = per_kv_head(p[..., split:], lambda rows: rows @ v)  # [B, Hkv, R, Lq, Dv]
                out = res if out is None else out + res
            assert out is not None  # blockwise_attention asks only for non-empty blocks
            return out

        visible = keep if own_mask else mask
        out = blockwise_attention(
            queries, scale, self.heads, length, score_fn, value_fn, visible, block, decode_block=decode_block
        )
        assert out is not None  # value_fn was given
        return out

    # --- rows as parts: every reshuffle (merge, filter, extend, extract, trim, restore) rebuilds ---
    def row_parts(self, b: int) -> RowParts:
        """Row b's live arrays as views (quantized tokens first, then the residual)."""
        q, r = self.quantized[b], self.residual[b]
        kq = vq = None
        if q:
            (codes, scales, biases), all_vq = self.packed()
            cols, groups = self.code_cols(q), q // self.group
            kq = (codes[b : b + 1, ..., :cols], scales[b : b + 1, ..., :groups], biases[b : b + 1, ..., :groups])
            vq = tuple(a[b : b + 1, :, :q] for a in all_vq)
        k_res = self.k_res[b : b + 1, :, self.res_end - r : self.res_end]  # [1, H, r, D]
        v_res = self.v_res[b : b + 1, :, self.res_end - r : self.res_end]  # [1, H, r, Dv]
        return RowParts(q, r, kq, vq, k_res, v_res)

    def roll_padding(self, padding: list[int]) -> None:
        """Finalize a right-padded chunk: each row's garbage tail wraps into its hole."""
        shifts = mx.array(padding)
        self.k_res = packing.roll_rows(self.k_res, shifts)
        self.v_res = packing.roll_rows(self.v_res, shifts)
        self.residual = [r - p for r, p in zip(self.residual, padding)]
        self.hold = False
        self.flush()


class RowParts:
    """One row's live arrays: q quantized tokens (K^T and V triples) and r residual tokens."""

    def __init__(
        self,
        q: int,
        r: int,
        kq: tuple[mx.array, ...] | None,
        vq: tuple[mx.array, ...] | None,
        k_res: mx.array,
        v_res: mx.array,
    ) -> None:
        self.q, self.r, self.kq, self.vq, self.k_res, self.v_res = q, r, kq, vq, k_res, v_res

    def packed(self) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]]:
        """(K^T triple, V triple): there when q > 0."""
        if self.kq is None or self.vq is None:
            raise RuntimeError("this KIVI row holds no quantized tokens")
        return self.kq, self.vq


def build_rows(
    config: KVCacheConfig, k_dim: int, v_dim: int, dtype: mx.Dtype, heads: int, parts: list[RowParts]
) -> KIVIRows:
    """Fresh rows (owned buffers, capacities trimmed to fit) holding `parts` in order."""
    rows = KIVIRows(config, k_dim, v_dim, dtype, len(parts), heads)
    longest_q = max(p.q for p in parts)
    if longest_q:
        rows.ensure_q_capacity(longest_q)
    live = max(p.r for p in parts)
    if live > rows.k_res.shape[2]:
        rows.compact_residual(live)
    rows.res_end = live
    for b, p in enumerate(parts):
        if p.q:
            kq, vq = rows.packed()
            for dst, src in zip(kq, p.packed()[0]):
                dst[b : b + 1, ..., : src.shape[-1]] = src
            for dst, src in zip(vq, p.packed()[1]):
                dst[b : b + 1, :, : p.q] = src
        if p.r:
            rows.k_res[b : b + 1, :, live - p.r : live] = p.k_res.astype(dtype)
            rows.v_res[b : b + 1, :, live - p.r : live] = p.v_res.astype(dtype)
        rows.quantized[b], rows.residual[b] = p.q, p.r
    return rows
