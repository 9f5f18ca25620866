"""Dense values of MLX-packed affine codes (a prefill block's copy), fast at every width.

`mx.dequantize` on CPU unpacks 2, 4 and 8-bit codes at ~2 ns per element but 3 and 6-bit codes,
which straddle bytes, at 10-26 ns, and 1-bit ones at ~4 (`make bench-kernels`). Those widths are
unpacked here with shifts and masks instead (~2-3 ns): a 3-byte unit holds 8 codes of 3 bits or 4
of 6, and 32 codes of 1 bit fill a word. Same layout (MLX's little-endian bit stream, which
`veloxd.kv.ops.bitpack` also writes), same result to the last bit. Not compiled: a compiled
kernel is shape-specialized and prefill blocks come in any length; uncompiled, the
intermediates are a few copies of one block, not of the cache. Only on the CPU device, where it
was measured: on Metal `mx.dequantize` is one kernel and each op here would be a launch.
"""

from __future__ import annotations

import mlx.core as mx

UNIT_BYTES = 3  # 24 bits: a whole number of 3-bit and 6-bit codes
SHIFTED = (1, 3, 6)  # widths unpacked here; the others are faster through mx.dequantize


def unpack_codes(packed: mx.array, bits: int) -> mx.array:
    """uint32 codes [..., n] of packed uint32 words [..., n * bits / 32]."""
    lead = packed.shape[:-1]
    if 32 % bits == 0:
        codes = (packed[..., None] >> mx.arange(0, 32, bits, dtype=mx.uint32)) & (2**bits - 1)  # [..., W, 32/b]
        return codes.reshape(*lead, -1)
    units = packed.view(mx.uint8).reshape(*lead, -1, UNIT_BYTES).astype(mx.uint32)  # [..., U, 3]: bytes
    words = units[..., 0] | (units[..., 1] << 8) | (units[..., 2] << 16)  # [..., U]: 24-bit units
    shifts = mx.arange(0, 8 * UNIT_BYTES, bits, dtype=mx.uint32)
    codes = (words[..., None] >> shifts) & (2**bits - 1)  # [..., U, 24/b]
    return codes.reshape(*lead, -1)


def dequantize(codes: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int) -> mx.array:
    """mx.dequantize(codes, scales, biases, group_size, bits), in the scales' dtype."""
    if bits in SHIFTED and mx.default_device() == mx.cpu:
        return shifted(codes, scales, biases, group_size, bits)
    return mx.dequantize(codes, scales, biases, group_size=group_size, bits=bits)


def shifted(codes: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int) -> mx.array:
    """`dequantize` by shifts and masks, widths 1, 2, 3, 4, 6 and 8 (faster than MLX's kernel at
    SHIFTED widths on CPU); ValueError for a width no 32-bit word or 24-bit unit holds whole."""
    if 32 % bits and 24 % bits:
        raise ValueError(f"{bits}-bit codes straddle 24-bit units: use mx.dequantize")
    lead = codes.shape[:-1]
    values = unpack_codes(codes, bits).astype(scales.dtype)
    grouped = values.reshape(*lead, -1, group_size)  # [..., groups, group_size]
    return (grouped * scales[..., None] + biases[..., None]).reshape(*lead, -1)  # [..., n]
