"""The channel-major key layout `make bench-kernels` times gives the same scores as the per-token one."""

from __future__ import annotations

import mlx.core as mx
import pytest

from benchmarks.kv import kernels


def affine_keys(heads: int, tokens: int, dim: int) -> tuple[mx.array, mx.array, mx.array]:
    """4-bit codes [H, T, D] with a scale and bias per token and group of kernels.GROUP channels."""
    codes = mx.random.randint(0, 16, (heads, tokens, dim)).astype(mx.uint32)
    shape = (heads, tokens, dim // kernels.GROUP)
    return codes, mx.random.uniform(0.01, 0.1, shape), mx.random.normal(shape)


def test_pack_along_last_is_mlx_packing() -> None:
    """Codes packed by pack_along_last dequantize back to themselves through MLX (low bits first)."""
    for bits in (1, 2, 4, 8):
        codes = mx.random.randint(0, 2**bits, (3, 256)).astype(mx.uint32)
        ones, zeros = mx.ones((3, 256 // 64)), mx.zeros((3, 256 // 64))
        words = kernels.pack_along_last(codes, bits)
        assert words.shape == (3, 256 * bits // 32)
        back = mx.dequantize(words, ones, zeros, group_size=64, bits=bits)
        assert mx.array_equal(back, codes.astype(mx.float32)).item(), bits


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("dim", [64, 128])
def test_channel_major_scores_equal_per_token_scores(rows: int, dim: int) -> None:
    mx.random.seed(rows * dim)
    codes, scales, biases = affine_keys(2, 384, dim)
    q = mx.random.normal((2, rows, dim))  # [Hkv, R, D]
    per_token = mx.quantized_matmul(
        q, kernels.pack_along_last(codes, 4), scales, biases, transpose=True, group_size=kernels.GROUP, bits=4
    )  # [Hkv, R, T]
    keys = codes.astype(mx.float32) * mx.repeat(scales, kernels.GROUP, -1) + mx.repeat(biases, kernels.GROUP, -1)
    dense = q @ keys.swapaxes(1, 2)
    channel_major = kernels.ChannelMajor.pack(codes, scales, biases, 4).scores(q)
    assert channel_major.shape == per_token.shape == (2, rows, 384)
    assert mx.allclose(per_token, dense, atol=1e-3).item()
    assert mx.allclose(channel_major, per_token, atol=1e-3).item()
    # a wrong scale order would still be finite: the tokens' scales must land on their own tokens
    swapped = kernels.ChannelMajor(
        kernels.ChannelMajor.pack(codes, scales, biases, 4).words, scales[:, ::-1], biases, 4
    ).scores(q)
    assert not mx.allclose(swapped, per_token, atol=1e-3).item()
