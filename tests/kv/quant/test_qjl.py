"""qjl: the sign-sketch estimator (unbiased, the paper's variance), packed scoring, cache contract."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import pytest

from tests.kv import contract as kc
from veloxd.kv.base import VeloxCache
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.quant.qjl import SignSketch


def test_estimator_is_unbiased_with_the_papers_variance() -> None:
    """Over 64 independent sketches: mean error ~ 0, variance = ((pi/2)|q|^2|k|^2 - (q·k)^2) / m."""
    d, m, n_keys, sketches = 128, 256, 64, 64
    q = mx.random.normal((d,), key=mx.random.key(1))
    keys = 0.3 * q + mx.random.normal((n_keys, d), key=mx.random.key(2))  # [n, d], q·k > 0 on average
    exact = keys @ q  # [n]
    norms = mx.linalg.norm(keys, axis=-1)
    estimates = []
    for layer in range(sketches):
        sketch = SignSketch(d, m, seed=3, layer_index=layer)
        signs = sketch.encode(keys)[None, None]  # [1, 1, n, m/32]
        projected = sketch.project(q)[None, None, None, None]  # [1, 1, 1, 1, m]
        estimates.append(
            sketch.estimate(projected, signs, norms.astype(mx.float16)[None, None, :, None], False)[0, 0, 0, 0]
        )
    errors = mx.stack(estimates) - exact  # [sketches, n]
    per_key_mean = errors.mean(axis=0)  # [n]
    stderr = errors.std(axis=0) / math.sqrt(sketches)
    z = (per_key_mean / stderr).abs()
    assert (z < 4).all().item(), z.max().item()
    per_sketch = errors.mean(axis=1)  # [sketches]: independent draws of S, each averaged over keys
    overall_z = abs(float(per_sketch.mean())) / (float(per_sketch.std()) / math.sqrt(sketches))
    assert overall_z < 4, overall_z
    theory = ((math.pi / 2) * (q @ q) * norms**2 - exact**2) / m  # [n]
    ratio = float((errors.var(axis=0) / theory).mean())
    assert 0.8 < ratio < 1.2, ratio


def test_packed_scores_equal_explicit_signs() -> None:
    sketch = SignSketch(128, 256, seed=0, layer_index=0)
    keys = mx.random.normal((1, 2, 33, 128), key=mx.random.key(4))
    q = mx.random.normal((1, 2, 3, 5, 128), key=mx.random.key(5))  # [B, Hkv, R, L, d]
    projected = sketch.project(q)
    explicit_signs = mx.where(keys @ sketch.matrix.T > 0, 1.0, -1.0)  # [1, 2, 33, m]
    explicit = projected @ mx.expand_dims(explicit_signs, 2).swapaxes(-1, -2)  # [1, 2, 3, 5, 33]
    for dense in (False, True):  # signs read packed, or unpacked for a dense matmul: same scores
        packed = sketch.inner(projected, sketch.encode(keys), dense)
        assert kc.relative_error(packed, explicit) < 1e-5, dense


def test_attention_error_shrinks_with_the_sketch() -> None:
    errors = [kc.attention_error(KVCacheConfig("qjl", bits=4, qjl_sketch_dim=m)) for m in (256, 1024, 4096)]
    # Score noise ~ 1/sqrt(m); at m = 2d the per-score error is ~90% of a random logit.
    assert errors[0] < 1.05 and errors[1] < 0.55 and errors[2] < 0.3, errors
    assert errors[0] > errors[1] > errors[2]
    two_bit_values = kc.attention_error(KVCacheConfig("qjl", bits=2, qjl_sketch_dim=4096))
    assert two_bit_values > errors[2]
    assert kc.attention_error(KVCacheConfig("qjl", bits=4, qjl_sketch_dim=4096), outlier_scale=20.0) < 0.6


def test_sketch_dim_must_fill_words() -> None:
    with pytest.raises(ValueError, match="qjl_sketch_dim=48 for method qjl: must be a multiple of 32"):
        KVCacheConfig("qjl", qjl_sketch_dim=48)


def test_state_round_trip_through_mlx_lm(tmp_path: Path) -> None:
    config = KVCacheConfig("qjl", bits=2, seed=4, qjl_sketch_dim=128, qjl_value_group_size=32)
    cache, loaded, copied = kc.state_round_trip(config, tmp_path / "cache.safetensors")
    assert type(loaded) is type(cache) and loaded.offset == 70 and loaded.config == config
    q = kc.queries(2, seed=9)
    expected = cache.attend(q, kc.SCALE, "causal")
    assert mx.array_equal(loaded.attend(q, kc.SCALE, "causal"), expected).item()
    assert mx.array_equal(copied.attend(q, kc.SCALE, "causal"), expected).item()


def test_trim_then_continue_equals_fresh_prefill() -> None:
    trimmed, fresh, n = kc.trim_then_continue(KVCacheConfig("qjl", bits=4))
    assert n == 10 and mx.array_equal(trimmed, fresh).item()


def test_batched_decode_equals_single_and_stays_packed() -> None:
    batched, single, batch = kc.batched_and_single(KVCacheConfig("qjl", bits=8))
    assert isinstance(batch, VeloxCache) and batch.store is not None and batch.store["k_signs"].dtype == mx.uint32
    for row in range(2):
        assert kc.relative_error(batched[row], single[row]) < 1e-5


@pytest.mark.parametrize("bits,sketch,group", [(4, 256, 64), (2, 128, 32), (8, 512, 128)])
def test_stored_bytes_match_the_analytic_rate(bits: int, sketch: int, group: int) -> None:
    config = KVCacheConfig("qjl", bits=bits, qjl_sketch_dim=sketch, qjl_value_group_size=group)
    held, analytic = kc.stored_bits_per_element(config)
    assert analytic == pytest.approx((sketch + 16 + 128 * (bits + 32 / group)) / 256)
    assert held == pytest.approx(analytic, rel=0.05)


def test_resident_memory_agrees_with_nbytes() -> None:
    grown, nbytes = kc.resident_bytes(KVCacheConfig("qjl", bits=4))
    per_token = (256 + 16 + 128 * 4.5) / 8
    assert nbytes == pytest.approx(1024 * 2 * per_token + 256 * 128 * 4)  # store + the sketch matrix
    assert grown == pytest.approx(nbytes, rel=0.05)


def test_tiny_model_next_tokens_agree_with_fp16(tiny_model: Path) -> None:
    reference = kc.teacher_forced_logits(tiny_model, KVCacheConfig("fp16"))
    agreement, kl8 = kc.agreement_and_kl(reference, kc.teacher_forced_logits(tiny_model, KVCacheConfig("qjl", bits=8)))
    _, kl2 = kc.agreement_and_kl(reference, kc.teacher_forced_logits(tiny_model, KVCacheConfig("qjl", bits=2)))
    assert agreement >= 0.9
    assert kl8 < 0.006 and kl8 < kl2 / 3
