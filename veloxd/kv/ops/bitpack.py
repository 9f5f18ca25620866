"""Pack b-bit codes (b = 1..8) into uint32 words along the last axis, exactly b bits per code.

Layout: the codes of a row form one little-endian bit stream, code i occupying stream bits
[b*i, b*(i+1)). This is MLX's own layout for `mx.quantize`, so a packed row can be read back
by `mx.dequantize` / `mx.quantized_matmul` with scale 1 and bias 0 (fast native kernels)
as well as by `unpack` here. A row of n codes takes n*b/32 words; n*b must be a multiple of
32 (any n that is a multiple of 32 works for every b).
"""

from __future__ import annotations

import mlx.core as mx

WORD_BITS = 32


def packed_width(n: int, bits: int) -> int:
    """uint32 words holding n codes of `bits` bits; ValueError when they do not fill whole words."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bit width must be in 1..8, not {bits}")
    if (n * bits) % WORD_BITS:
        raise ValueError(f"{n} codes of {bits} bits do not fill whole 32-bit words")
    return n * bits // WORD_BITS


def pack(codes: mx.array, bits: int) -> mx.array:
    """codes [..., n] (integers in [0, 2^bits)) -> uint32 [..., n*bits/32]."""
    n = codes.shape[-1]
    width = packed_width(n, bits)
    lead = codes.shape[:-1]
    planes = (codes.astype(mx.uint32)[..., None] >> mx.arange(bits, dtype=mx.uint32)) & 1  # [..., n, bits]
    stream = planes.reshape(*lead, width, WORD_BITS)  # [..., words, 32]: stream bits per word
    return (stream << mx.arange(WORD_BITS, dtype=mx.uint32)).sum(axis=-1).astype(mx.uint32)  # [..., words]


def unpack(words: mx.array, bits: int, n: int) -> mx.array:
    """Inverse of `pack`: uint32 [..., n*bits/32] -> uint32 codes [..., n]."""
    width = packed_width(n, bits)
    if words.shape[-1] != width:
        raise ValueError(f"expected {width} words for {n} codes of {bits} bits, got {words.shape[-1]}")
    lead = words.shape[:-1]
    stream = (words[..., None] >> mx.arange(WORD_BITS, dtype=mx.uint32)) & 1  # [..., words, 32]
    planes = stream.reshape(*lead, n, bits)  # [..., n, bits]
    return (planes << mx.arange(bits, dtype=mx.uint32)).sum(axis=-1).astype(mx.uint32)  # [..., n]


def native_group(n: int) -> int:
    """Largest MLX group size (128, 64 or 32) dividing n."""
    for group in (128, 64, 32):
        if n % group == 0:
            return group
    raise ValueError(f"native unpacking needs a multiple of 32 codes per row, not {n}")
