"""Properties (hypothesis): packed codes read back exactly, over random shapes and every bit width
the methods store (veloxd/kv/ops/bitpack.py, and the Lloyd-Max layout of veloxd/kv/ops/levels.py)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from veloxd.kv.ops import bitpack, codebooks, dequant
from veloxd.kv.ops.levels import LevelCodes

# 1: QJL's sign sketch and the sign plane of split Lloyd-Max codes; 2-8: the methods' `bits`
# choices, TurboQuant's one extra bit for outlier channels and its keys' bits - 1.
WIDTHS = st.integers(1, 8)
LLOYD_WIDTHS = st.integers(1, 5)  # codebooks.lloyd_max's range
PROPERTY = settings(max_examples=40, deadline=None)


@st.composite
def codes(draw: st.DrawFn, bits: int) -> np.ndarray:
    """Codes in [0, 2^bits) of a random leading shape; rows of n codes that fill whole words."""
    lead = tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
    step = 32 // math.gcd(bits, 32)  # the fewest codes of `bits` bits that fill whole words
    n = step * draw(st.integers(1, max(1, 256 // step)))
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).integers(0, 2**bits, size=(*lead, n), dtype=np.uint32)


@PROPERTY
@given(data=st.data(), bits=WIDTHS)
def test_pack_then_unpack_returns_the_codes_in_exactly_b_bits_each(data: st.DataObject, bits: int) -> None:
    given_codes = data.draw(codes(bits))
    n = given_codes.shape[-1]
    packed = bitpack.pack(mx.array(given_codes), bits)
    assert packed.dtype == mx.uint32 and packed.shape == (*given_codes.shape[:-1], n * bits // 32)
    np.testing.assert_array_equal(np.array(bitpack.unpack(packed, bits, n)), given_codes)


@PROPERTY
@given(data=st.data(), bits=st.sampled_from((2, 3, 4, 6, 8)))
def test_packed_rows_are_mlx_quantize_layout(data: st.DataObject, bits: int) -> None:
    """MLX's dequantize with scale 1 and bias 0 reads the same codes (the native kernels' input)."""
    given_codes = data.draw(codes(bits))
    rows = given_codes.reshape(-1, given_codes.shape[-1])  # [rows, n]: dequantize takes a matrix
    n = rows.shape[-1]
    if n % 32:
        rows = np.concatenate([rows] * (32 // math.gcd(n, 32)), axis=-1)  # whole 32-code groups
        n = rows.shape[-1]
    group = bitpack.native_group(n)
    ones = mx.ones((rows.shape[0], n // group), dtype=mx.float32)
    read = mx.dequantize(bitpack.pack(mx.array(rows), bits), ones, mx.zeros_like(ones), group_size=group, bits=bits)
    np.testing.assert_array_equal(np.array(read), rows.astype(np.float32))


@settings(max_examples=15, deadline=None)  # each new shape compiles a decode kernel
@given(data=st.data(), bits=LLOYD_WIDTHS)
def test_lloyd_max_codes_read_back_as_their_levels(data: st.DataObject, bits: int) -> None:
    """Packed (split sign-magnitude at 3 and 5 bits), exactly b bits per code, decoded to each code's level."""
    width = data.draw(st.sampled_from((32, 64, 96, 128)))
    tokens = data.draw(st.integers(1, 40))
    seed = data.draw(st.integers(0, 2**32 - 1))
    given_codes = np.random.default_rng(seed).integers(0, 2**bits, size=(1, 2, tokens, width), dtype=np.uint32)
    levels = codebooks.lloyd_max(128, bits).levels
    layout = LevelCodes(levels, bits, width)
    arrays = layout.pack(mx.array(given_codes))
    assert sum(a.shape[-1] for a in arrays) * 32 == width * bits
    np.testing.assert_allclose(np.array(layout.levels(arrays)), levels[given_codes], rtol=1e-5, atol=1e-6)


@PROPERTY
@given(
    data=st.data(),
    bits=st.sampled_from((1, 2, 3, 4, 6, 8)),
    group=st.sampled_from((32, 64, 128)),
    dtype=st.sampled_from((mx.float16, mx.float32)),
)
def test_block_dequantize_equals_mlx_dequantize(data: st.DataObject, bits: int, group: int, dtype: mx.Dtype) -> None:
    """ops.dequant reads mx.quantize's triples to the last bit: its shifts and masks at every width
    (the CPU's path for 1, 3 and 6 bits, on whatever device runs the test), and its dispatch."""
    lead = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))  # quantize needs a matrix
    n = group * data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**32 - 1))
    x = mx.random.normal((*lead, n), key=mx.random.key(seed)).astype(dtype)
    codes, scales, biases = mx.quantize(x, group_size=group, bits=bits)
    theirs = mx.dequantize(codes, scales, biases, group_size=group, bits=bits)
    for ours in (
        dequant.shifted(codes, scales, biases, group, bits),
        dequant.dequantize(codes, scales, biases, group, bits),
    ):
        assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape == x.shape
        np.testing.assert_array_equal(np.array(ours.astype(mx.float32)), np.array(theirs.astype(mx.float32)))
