"""Lloyd-Max codes stored packed, and matmuls against their levels, fast on CPU (no gather).

MLX's generic gather (`mx.take`) costs ~7-18 ns per element on CPU and would dominate decode,
and codes that straddle 32-bit words (3 and 5 bits) unpack slowly. So:
- b in {1, 2, 4}: one packed array of indices; the symmetric codebook is the odd polynomial
  through its levels in u = (code - c) / c, c = (2^b - 1) / 2 (exact at the nodes to ~1e-7).
- b in {3, 5}: sign-magnitude, still exactly b bits: a (b-1)-bit magnitude index plus a
  1-bit sign plane; level = sign · P(magnitude), P the polynomial through the positive levels.
Unpacking (shift and mask) and the polynomial run as one fused kernel (mx.compile), ~1.7x faster
than MLX's dequantize followed by the polynomial.
Compiled kernels are shape-specialized (MLX's shapeless mode ran 2-10x slower here), so tokens
are processed in fixed chunks of 1024 or 256 (the last one zero-padded to a power of two): a
bounded set of shapes, and the dequantized levels held at once are bounded by one chunk, which
is at most one attention block (veloxd.kv.ops.blockwise reads keys a block at a time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache

import mlx.core as mx
import numpy as np

from veloxd.kv.ops import bitpack
from veloxd.kv.ops.dequant import unpack_codes

CHUNKS = (1024, 256)  # full chunks of the first size, the tail in (padded) chunks of the second
MIN_CHUNK = 32  # smallest padded chunk: the compiled shapes stay a small fixed set
SPLIT_BITS = (3, 5)  # widths whose codes straddle words: stored as sign + magnitude


def _solve(nodes: np.ndarray, values: np.ndarray, powers: list[int]) -> tuple[float, ...]:
    vandermonde = np.stack([nodes**k for k in powers], axis=1)  # [n, n]
    return tuple(float(a) for a in np.linalg.solve(vandermonde, values))


def odd_coefficients(levels: np.ndarray) -> tuple[float, ...]:
    """a_k with levels[i] = sum_k a_k u_i^(2k+1), u_i = (i - c) / c (symmetric ascending levels)."""
    n = len(levels)
    centre = (n - 1) / 2
    u = (np.arange(n // 2, n) - centre) / centre  # positive nodes
    return _solve(u, levels[n // 2 :], [2 * k + 1 for k in range(n // 2)])


def magnitude_coefficients(levels: np.ndarray) -> tuple[float, ...]:
    """a_k with positive level j = sum_k a_k v_j^k, v_j = j / c - 1, c = (n/2 - 1) / 2."""
    half = len(levels) // 2
    centre = (half - 1) / 2
    return _solve(np.arange(half) / centre - 1, levels[half:], list(range(half)))


def _unpack(packed: mx.array, bits: int) -> mx.array:
    """Codes as float32 [..., W * 32/bits] from packed words [..., W]; bits divides 32 (no straddling)."""
    return unpack_codes(packed, bits).astype(mx.float32)


@cache
def _odd_decoder(bits: int, coefficients: tuple[float, ...]) -> Callable[[mx.array], mx.array]:
    """packed -> levels: unpack, centre, odd Horner in u^2, fused into one kernel by mx.compile."""
    centre = (2**bits - 1) / 2

    def decode(packed: mx.array) -> mx.array:
        u = _unpack(packed, bits) * (1 / centre) - 1.0
        u2 = u * u
        acc = coefficients[-1]
        for a in reversed(coefficients[:-1]):
            acc = acc * u2 + a
        return acc * u

    return mx.compile(decode)


@cache
def _signed_decoder(bits: int, coefficients: tuple[float, ...]) -> Callable[[mx.array, mx.array], mx.array]:
    """(packed magnitudes, packed signs) -> levels = sign * P(magnitude), one fused kernel."""
    centre = (2 ** (bits - 1) - 1) / 2

    def decode(magnitudes: mx.array, signs: mx.array) -> mx.array:
        v = _unpack(magnitudes, bits - 1) * (1 / centre) - 1.0
        acc = coefficients[-1]
        for a in reversed(coefficients[:-1]):
            acc = acc * v + a
        return acc * (2.0 * _unpack(signs, 1) - 1.0)

    return mx.compile(decode)


def chunks(n: int) -> Iterator[tuple[int, int, int]]:
    """(start, stop, padded size) covering [0, n): full chunks of CHUNKS[0], then of CHUNKS[1],
    and a last one padded to a power of two (>= MIN_CHUNK), so a short key block decodes no more
    than about its own size."""
    big, small = CHUNKS
    start = 0
    while n - start >= big:
        yield start, start + big, big
        start += big
    while start < n:
        size = small if n - start >= small else max(MIN_CHUNK, 1 << (n - start - 1).bit_length())
        yield start, min(start + size, n), size
        start += size


class LevelCodes:
    """Packs Lloyd-Max indices of one channel range and multiplies by their levels."""

    def __init__(self, levels: np.ndarray, bits: int, width: int) -> None:
        self.bits, self.width = bits, width
        self.split = bits in SPLIT_BITS
        self.half = 2 ** (bits - 1)
        # Keep only the coefficients: compiled functions cannot be deep-copied (mlx_lm's prompt
        # cache deep-copies caches), so the kernel is looked up in the module's cache per call.
        if self.split:
            self.coefficients = magnitude_coefficients(np.asarray(levels))
        else:
            self.coefficients = odd_coefficients(np.asarray(levels))

    def decode(self, *arrays: mx.array) -> mx.array:
        make = _signed_decoder if self.split else _odd_decoder
        return make(self.bits, self.coefficients)(*arrays)

    def names(self, base: str) -> tuple[str, ...]:
        return (base, f"{base}_signs") if self.split else (base,)

    def pack(self, codes: mx.array) -> list[mx.array]:
        """Ascending level indices [..., width] -> the packed arrays named by `names`."""
        if not self.split:
            return [bitpack.pack(codes, self.bits)]
        positive = codes >= self.half
        magnitude = mx.where(positive, codes - self.half, self.half - 1 - codes)
        return [bitpack.pack(magnitude, self.bits - 1), bitpack.pack(positive, 1)]

    def levels(self, arrays: list[mx.array], dtype: mx.Dtype = mx.float32) -> mx.array:
        """Levels [..., n, width] of the packed arrays [..., n, W]."""
        return self.decode(*arrays).astype(dtype)

    def _chunk(self, arrays: list[mx.array], start: int, stop: int, size: int, dtype: mx.Dtype) -> mx.array:
        parts = [a[:, :, start:stop] for a in arrays]  # [B, H, m, W]
        if stop - start < size:  # pad to the chunk shape so the compiled kernel is reused
            parts = [mx.pad(a, [(0, 0), (0, 0), (0, size - (stop - start)), (0, 0)]) for a in parts]
        return self.levels(parts, dtype)[:, :, : stop - start]  # [B, H, m, width]

    def block_levels(self, arrays: list[mx.array], dtype: mx.Dtype) -> mx.array:
        """Levels [B, H, n, width] of a whole key block (a prefill block's dense copy), decoded in
        the fixed chunk shapes."""
        n = arrays[0].shape[2]
        parts = [self._chunk(arrays, start, stop, size, dtype) for start, stop, size in chunks(n)]
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)

    def dot(self, q: mx.array, arrays: list[mx.array]) -> mx.array:
        """q [B, H, R, L, width] · levels^T -> [B, H, R, L, n]."""
        B, H, R, L, _ = q.shape
        rows = q.reshape(B, H, R * L, self.width)  # [B, H, R*L, width]: no broadcast copy of the levels
        out = [mx.zeros((B, H, R * L, 0), dtype=q.dtype)]
        for start, stop, size in chunks(arrays[0].shape[2]):
            levels = self._chunk(arrays, start, stop, size, q.dtype)  # [B, H, m, width]
            out.append(rows @ levels.swapaxes(-1, -2))  # [B, H, R*L, m]
        scores = out[1] if len(out) == 2 else mx.concatenate(out, axis=-1)
        return scores.reshape(B, H, R, L, -1)  # [B, H, R, L, n]

    def weighted(self, p: mx.array, arrays: list[mx.array]) -> mx.array:
        """p [B, H, R, L, n] @ levels -> [B, H, R, L, width]."""
        B, H, R, L, _ = p.shape
        rows = p.reshape(B, H, R * L, -1)  # [B, H, R*L, n]
        total = mx.zeros((B, H, R * L, self.width), dtype=p.dtype)
        for start, stop, size in chunks(arrays[0].shape[2]):
            levels = self._chunk(arrays, start, stop, size, p.dtype)  # [B, H, m, width]
            total = total + rows[..., start:stop] @ levels  # [B, H, R*L, width]
        return total.reshape(B, H, R, L, self.width)  # [B, H, R, L, width]
