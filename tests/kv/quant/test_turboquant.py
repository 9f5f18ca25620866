"""turboquant_mse / turboquant_prod: codebooks, bit packing, errors, unbiasedness, cache contract."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from tests.kv import contract as kc
from veloxd.kv.base import LayerSpec, VeloxCache, int_list
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops import bitpack, codebooks
from veloxd.kv.ops.hadamard import Rotation
from veloxd.kv.ops.levels import LevelCodes, chunks
from veloxd.kv.quant.turboquant import RotatedQuantizer, TurboQuantMSECodec, TurboQuantProdCodec

# Distortion per unit vector of the Lloyd-Max quantizer (TurboQuant paper, large-d limit).
PAPER_DISTORTION = {1: 0.36, 2: 0.117, 3: 0.0345, 4: 0.0095}
METHODS = ("turboquant_mse", "turboquant_prod")


# --- codebooks ---
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_lloyd_max_matches_the_papers_distortion(bits: int) -> None:
    book = codebooks.lloyd_max(128, bits)
    assert len(book.levels) == 2**bits
    assert np.all(np.diff(book.levels) > 0)
    np.testing.assert_allclose(book.levels, -book.levels[::-1], atol=1e-12)  # symmetric
    np.testing.assert_allclose(book.thresholds, (book.levels[1:] + book.levels[:-1]) / 2)
    assert book.distortion == pytest.approx(PAPER_DISTORTION[bits], rel=0.05)
    # Large d tends to the Gaussian Lloyd-Max quantizer: 1 bit at ±sqrt(2/pi)/sqrt(d).
    if bits == 1:
        assert codebooks.lloyd_max(4096, 1).levels[1] * math.sqrt(4096) == pytest.approx(
            math.sqrt(2 / math.pi), rel=1e-3
        )
    # Evenly spaced levels can only be worse (or equal, at 1 bit).
    assert codebooks.uniform(128, bits).distortion >= book.distortion * (1 - 1e-6)


@pytest.mark.parametrize("bits", [2, 4])
def test_measured_distortion_on_rotated_unit_vectors(bits: int) -> None:
    quantizer = RotatedQuantizer("k_", 128, bits, 0, "lloyd_max")
    x = mx.random.normal((4000, 128), key=mx.random.key(0))
    rotated = Rotation(128, seed=0, layer_index=0).apply(x)
    _, recon = quantizer.encode(rotated)
    unit_error = float((((rotated - recon) ** 2).sum(-1) / (rotated**2).sum(-1)).mean())
    assert unit_error == pytest.approx(codebooks.lloyd_max(128, bits).distortion, rel=0.1)


def test_bad_bit_widths_are_refused() -> None:
    with pytest.raises(ValueError, match=r"1\.\.5 bits"):
        codebooks.lloyd_max(128, 6)
    with pytest.raises(ValueError, match=">= 3"):
        codebooks.uniform(2, 2)


# --- bit packing and level lookup ---
@pytest.mark.parametrize("bits", range(1, 9))
def test_bitpack_round_trip_takes_exactly_b_bits(bits: int) -> None:
    codes = mx.random.randint(0, 2**bits, (3, 5, 96), key=mx.random.key(bits)).astype(mx.uint32)
    packed = bitpack.pack(codes, bits)
    assert packed.dtype == mx.uint32 and packed.shape == (3, 5, 96 * bits // 32)
    assert mx.array_equal(bitpack.unpack(packed, bits, 96), codes).item()


def test_bitpack_refuses_rows_that_do_not_fill_words() -> None:
    with pytest.raises(ValueError, match="whole 32-bit words"):
        bitpack.pack(mx.zeros((2, 20), dtype=mx.uint32), 3)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_packed_levels_reproduce_every_codebook_level_at_b_bits(bits: int) -> None:
    levels = codebooks.lloyd_max(128, bits).levels
    codes = mx.array(np.resize(np.arange(2**bits), (1, 1, 300, 64)).astype(np.uint32))  # every level, many times
    layout = LevelCodes(levels, bits, 64)
    arrays = layout.pack(codes)
    assert sum(a.shape[-1] for a in arrays) * 32 == 64 * bits  # sign-magnitude splits keep b bits
    expected = levels[np.array(codes)]
    np.testing.assert_allclose(np.array(layout.levels(arrays)), expected, rtol=1e-5, atol=1e-7)
    q = mx.random.normal((1, 1, 2, 3, 64), key=mx.random.key(0))  # [B, H, R, L, width]
    exact_scores = q @ mx.array(expected.astype(np.float32))[:, :, None].swapaxes(-1, -2)
    assert kc.relative_error(layout.dot(q, arrays), exact_scores) < 1e-5  # 300 tokens: 256 + padded tail
    p = mx.softmax(exact_scores, axis=-1)
    exact_out = p @ mx.array(expected.astype(np.float32))[:, :, None]
    assert kc.relative_error(layout.weighted(p, arrays), exact_out) < 1e-5


def test_chunks_cover_tokens_with_few_shapes() -> None:
    assert list(chunks(2500)) == [(0, 1024, 1024), (1024, 2048, 1024), (2048, 2304, 256), (2304, 2500, 256)]
    assert list(chunks(64)) == [(0, 64, 64)] and list(chunks(5)) == [(0, 5, 32)]  # a short block: its own size
    assert {size for n in range(1, 3000, 7) for _, _, size in chunks(n)} == {32, 64, 128, 256, 1024}
    assert list(chunks(0)) == []


# --- errors ---
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_rotation_keeps_outlier_keys_at_the_design_distortion(bits: int) -> None:
    """Unit-vector error (weighted by ||k||^2, as scores weigh it) with 4 key channels x20."""
    keys, _ = kc.kv(1000, seed=0, outlier_scale=20.0)
    quantizer = RotatedQuantizer("k_", 128, bits, 0, "lloyd_max")
    design = codebooks.lloyd_max(128, bits).distortion

    def weighted_error(x: mx.array) -> float:
        _, recon = quantizer.encode(x)
        return float(((x - recon) ** 2).sum() / (x**2).sum())

    rotated = weighted_error(Rotation(128, seed=0, layer_index=0).apply(keys))
    assert rotated < 1.2 * design  # (often below: the rotated outliers are not Gaussian)
    assert weighted_error(keys) > 3 * design  # without the rotation the codebook does not fit


@pytest.mark.parametrize("codebook", ["lloyd_max", "uniform"])
@pytest.mark.parametrize("bits,bound,outlier_bound", [(2, 0.55, None), (3, 0.32, 0.75), (4, 0.18, 0.5)])
def test_mse_attention_error_within_bounds(bits: int, bound: float, outlier_bound: float | None, codebook: str) -> None:
    config = KVCacheConfig("turboquant_mse", bits=bits, turboquant_codebook=codebook)
    assert kc.attention_error(config) < bound
    if outlier_bound is not None:  # outlier keys make logits ~4x larger: the softmax is sharper
        assert kc.attention_error(config, outlier_scale=20.0) < outlier_bound


def test_outlier_channels_add_a_bit_and_lower_the_error() -> None:
    plain = KVCacheConfig("turboquant_mse", bits=3)
    split = KVCacheConfig("turboquant_mse", bits=3, turboquant_outlier_channels=64)
    codec = TurboQuantMSECodec(split, LayerSpec(0, 1), 128, 128)
    assert codec.bits_per_token() / (codec.k_dim + codec.v_dim) == pytest.approx(3 + 64 / 128 + 16 / 128)  # 3.625
    assert kc.attention_error(split) < kc.attention_error(plain)
    with pytest.raises(ValueError, match="multiple of 32"):
        KVCacheConfig("turboquant_mse", bits=3, turboquant_outlier_channels=40)


def test_prod_scores_are_unbiased_where_mse_at_one_bit_less_is_shrunk() -> None:
    """Mean of (estimate - q·k) over many keys and 32 independent layers (rotations, sketches)."""
    d, n_keys, layers = 128, 256, 32
    q = mx.random.normal((1, 1, 1, 1, d), key=mx.random.key(1))  # [B, Hkv, R, L, d]
    keys = q[0, 0] + 0.5 * mx.random.normal((1, 1, n_keys, d), key=mx.random.key(2))  # correlated with q
    exact = (q[0, 0, 0] @ keys[0, 0].T)[0]  # [n]
    errors: dict[str, list[mx.array]] = {"turboquant_prod": [], "turboquant_mse": []}
    for layer in range(layers):
        for method, bits in (("turboquant_prod", 3), ("turboquant_mse", 2)):
            codec_type = TurboQuantProdCodec if method == "turboquant_prod" else TurboQuantMSECodec
            codec = codec_type(KVCacheConfig(method, bits=bits), LayerSpec(layer, layers), d, d)
            store = codec.encode(keys, keys)
            rotated_q = codec.rotate_queries(q[0]).reshape(1, 1, 1, 1, -1)  # [B, Hkv, R, L, d (+ d)]
            errors[method].append(codec.scores(rotated_q, store)[0, 0, 0, 0] - exact)
    stats: dict[str, tuple[float, float]] = {}  # method -> (mean error, its standard error)
    for method, layer_errors in errors.items():
        per_layer = mx.stack([e.mean() for e in layer_errors])  # layers are independent draws
        stats[method] = float(per_layer.mean()), float(per_layer.std() / math.sqrt(layers))
    prod_mean, prod_se = stats["turboquant_prod"]
    mse_mean, mse_se = stats["turboquant_mse"]
    assert abs(prod_mean) < 4 * prod_se, stats
    assert mse_mean < -4 * mse_se, stats  # Lloyd-Max shrinks inner products by about (1 - D)


# --- cache contract ---
@pytest.mark.parametrize("method", METHODS)
def test_attention_error_at_every_bit_width(method: str) -> None:
    for bits, bound in ((2, 0.9), (3, 0.55), (4, 0.3)):
        assert kc.attention_error(KVCacheConfig(method, bits=bits)) < bound, (method, bits)


@pytest.mark.parametrize("method", METHODS)
def test_state_round_trip_through_mlx_lm(method: str, tmp_path: Path) -> None:
    config = KVCacheConfig(method, bits=3, seed=5)
    cache, loaded, copied = kc.state_round_trip(config, tmp_path / "cache.safetensors")
    assert type(loaded) is type(cache) and loaded.offset == cache.offset == 70
    assert loaded.config == config and loaded.layer == cache.layer
    q = kc.queries(2, seed=9)
    expected = cache.attend(q, kc.SCALE, "causal")
    assert mx.array_equal(loaded.attend(q, kc.SCALE, "causal"), expected).item()
    assert mx.array_equal(copied.attend(q, kc.SCALE, "causal"), expected).item()


@pytest.mark.parametrize("method", METHODS)
def test_trim_then_continue_equals_fresh_prefill(method: str) -> None:
    trimmed, fresh, n = kc.trim_then_continue(KVCacheConfig(method, bits=4, recent_window=0))
    assert n == 10
    assert mx.array_equal(trimmed, fresh).item()


@pytest.mark.parametrize("method", METHODS)
def test_batched_decode_equals_single_and_stays_packed(method: str) -> None:
    batched, single, batch = kc.batched_and_single(KVCacheConfig(method, bits=4))
    assert isinstance(batch, VeloxCache) and batch.store is not None
    assert all(a.dtype == mx.uint32 for n, a in batch.store.items() if "codes" in n or "signs" in n)
    for row in range(2):
        assert kc.relative_error(batched[row], single[row]) < 1e-5


@pytest.mark.parametrize(
    "method,bits,outliers,expected",
    [
        ("turboquant_mse", 3, 0, 3 + 16 / 128),
        ("turboquant_mse", 4, 32, 4.25 + 16 / 128),
        ("turboquant_prod", 3, 0, (2 + 1 + 32 / 128 + 3 + 16 / 128) / 2),
        ("turboquant_prod", 2, 0, (2 + 32 / 128 + 2 + 16 / 128) / 2),
    ],
)
def test_stored_bytes_match_the_analytic_rate(method: str, bits: int, outliers: int, expected: float) -> None:
    config = KVCacheConfig(method, bits=bits, turboquant_outlier_channels=outliers)
    held, analytic = kc.stored_bits_per_element(config)
    assert analytic == pytest.approx(expected)
    assert held == pytest.approx(analytic, rel=0.05)


def test_resident_memory_agrees_with_nbytes() -> None:
    grown, nbytes = kc.resident_bytes(KVCacheConfig("turboquant_mse", bits=3, recent_window=0))
    codebooks_bytes = 2 * 4 * (7 + 7)  # thresholds and level steps of the 3-bit codebook, keys and values
    assert nbytes == 1024 * 2 * 2 * (3 * 128 + 16) / 8 + 2 * 128 * 4 + codebooks_bytes  # codes, norms, signs
    assert grown == pytest.approx(nbytes, rel=0.05)


# --- the tiny model ---
@pytest.mark.parametrize("method", METHODS)
def test_tiny_model_next_tokens_agree_with_fp16(tiny_model: Path, method: str) -> None:
    """Teacher-forced: the random tiny model repeats one token under greedy decoding (for every
    cache, fp16 included), so free-running greedy agreement would prove nothing."""
    reference = kc.teacher_forced_logits(tiny_model, KVCacheConfig("fp16"))
    assert len(set(int_list(mx.argmax(reference, -1)))) > 10  # the positions disagree among themselves
    agreement, kl4 = kc.agreement_and_kl(reference, kc.teacher_forced_logits(tiny_model, KVCacheConfig(method, bits=4)))
    _, kl2 = kc.agreement_and_kl(reference, kc.teacher_forced_logits(tiny_model, KVCacheConfig(method, bits=2)))
    assert agreement >= 0.9
    assert kl4 < 0.003 and kl4 < kl2 / 4


def test_head_dimensions_that_do_not_fill_words_are_refused() -> None:
    with pytest.raises(ValueError, match="head dimension 80 is not a multiple of 32"):
        TurboQuantMSECodec(KVCacheConfig("turboquant_mse"), LayerSpec(0, 1), 80, 80)


@pytest.mark.parametrize("codebook", ["lloyd_max", "uniform"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("outliers", [0, 32])
def test_dense_prefill_reads_equal_packed_reads(method: str, codebook: str, outliers: int) -> None:
    """A prefill chunk multiplies a decoded key block densely (gains folded into the block; prod:
    one matmul of [rotated | sketched] queries against [mse | sketch] rows); a decode step reads
    the packed codes. Both give the same scores and weighted values."""
    config = KVCacheConfig(method=method, bits=4, turboquant_codebook=codebook, turboquant_outlier_channels=outliers)
    codec_type = TurboQuantMSECodec if method == "turboquant_mse" else TurboQuantProdCodec
    codec = codec_type(config, LayerSpec(0, 2), 128, 128)
    keys, values = (mx.random.normal((1, 2, 300, 128), key=mx.random.key(s)) for s in (1, 2))
    store = codec.encode(keys, values)
    queries = mx.random.normal((1, 8, 16, 128), key=mx.random.key(3))  # 4 per KV head x 16 rows: dense
    dense, packed = codec.for_call(queries, 2), codec.for_call(queries[:, :, :1], 2)
    assert dense.dense and not packed.dense
    q = codec.rotate_queries(queries).reshape(1, 2, 4, 16, -1)  # [B, Hkv, R, L, D (+ sketch)]
    assert kc.relative_error(dense.scores(q, store), packed.scores(q, store)) < 1e-5
    p = mx.softmax(dense.scores(q, store), axis=-1)  # [B, Hkv, R, L, 300]
    assert kc.relative_error(dense.weighted_values(p, store), packed.weighted_values(p, store)) < 1e-5
