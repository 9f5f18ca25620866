"""`kivi`: per-channel keys, per-token values, the exact window, memory, trim exactness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, load_prompt_cache, save_prompt_cache

from tests.kv.support import DIM, HEADS, OUTLIER_CHANNELS, SCALE, data, held_arrays, reference_attention, rel
from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.quant.affine import AffineCache, quantize_fp16
from veloxd.kv.quant.kivi import KIVICache


def kivi(bits: int = 4, group: int = 32, window: int = 128) -> KIVICache:
    config = KVCacheConfig(method="kivi", bits=bits, kivi_group_size=group, kivi_residual_length=window)
    return KIVICache(config, LayerSpec(0, 1))


def decode_error(cache: VeloxCache, q: mx.array, k: mx.array, v: mx.array, last: int = 64) -> float:
    """Error of the last `last` queries once everything beyond the window is quantized."""
    cache.update_and_fetch(k, v)
    cache.attend(q[:, :, -1:], SCALE, None)  # the chunk attended itself exactly; now it is packed
    out = cache.attend(q[:, :, -last:], SCALE, "causal")
    return rel(out, reference_attention(q[:, :, -last:], k, v, SCALE, "causal"))


@pytest.mark.parametrize("group, window", [(32, 0), (32, 64), (64, 128), (128, 128)])
def test_window_holds_r_to_r_plus_g_exact_tokens(group: int, window: int) -> None:
    _, k, v = data(700)
    cache = kivi(4, group, window)
    q = mx.zeros((1, 2 * HEADS, 1, DIM))
    fed = 0
    for size in (5, 150, 1, 1, 300, 33, 1, 200, 9):
        cache.update_and_fetch(k[:, :, fed : fed + size], v[:, :, fed : fed + size])
        cache.attend(mx.zeros((1, 2 * HEADS, size, DIM)), SCALE, "causal" if size > 1 else None)
        fed += size
        assert cache.rows is not None  # built by the first append
        quantized, residual = cache.rows.quantized[0], cache.rows.residual[0]
        assert quantized + residual == cache.offset == fed
        assert quantized % group == 0
        assert residual < window + group
        assert residual >= window or quantized == 0
    assert cache.attend(q, SCALE, None).shape == (1, 2 * HEADS, 1, DIM)


@pytest.mark.parametrize("bits, bound", [(2, 0.6), (4, 0.15)])
def test_attention_error_on_random_data(bits: int, bound: float) -> None:
    q, k, v = data()
    assert decode_error(kivi(bits, window=0), q, k, v) < bound
    assert decode_error(kivi(bits, window=128), q, k, v) < bound


def test_per_channel_keys_beat_per_token_groups_on_outlier_channels() -> None:
    q, k, v = data(outliers=True)
    # reconstruction of the ordinary channels, which per-token groups crush next to an outlier
    normal = mx.array([c for c in range(DIM) if c not in OUTLIER_CHANNELS])
    per_channel = mx.dequantize(*quantize_fp16(k.swapaxes(-1, -2), 32, 4), group_size=32, bits=4).swapaxes(-1, -2)
    per_token = mx.dequantize(*quantize_fp16(k, 32, 4), group_size=32, bits=4)
    channel_error = rel(per_channel[..., normal].astype(mx.float32), k[..., normal])
    assert channel_error < 0.5 * rel(per_token[..., normal].astype(mx.float32), k[..., normal])
    # and the attention output
    # per-token groups as they are, with no rotation to spread the outliers and no exact window
    plain: dict[str, Any] = {"affine_rotate": False, "recent_window": 0}
    affine = AffineCache(KVCacheConfig(method="affine", bits=4, affine_group_size=32, **plain), LayerSpec(0, 1))
    ours = decode_error(kivi(4, window=0), q, k, v)
    assert ours < 0.7 * decode_error(affine, q, k, v)
    assert ours < 0.25


@pytest.mark.parametrize("bits", [2, 4])
def test_memory_is_packed_groups_plus_the_declared_window(bits: int) -> None:
    group, window, n = 32, 128, 1160  # 1024 quantized tokens (no capacity padding), 136 exact
    _, k, v = data(n)
    k, v = k.astype(mx.float16), v.astype(mx.float16)
    cache = kivi(bits, group, window)
    cache.update_and_fetch(k, v)
    assert cache.rows is not None  # built by the first append
    cache.rows.flush()
    assert (cache.rows.quantized[0], cache.rows.residual[0]) == (1024, 136)
    assert cache.nbytes == sum(a.nbytes for a in held_arrays(cache))
    packed = HEADS * 1024 * 2 * DIM * (bits + 32 / group) / 8  # K and V: bits + fp16 scale/zero per group
    window_bytes = HEADS * (window + group) * 2 * DIM * 2  # fp16 window capacity: R + G slots
    assert abs(cache.nbytes - (packed + window_bytes)) <= 0.05 * cache.nbytes
    fp16 = KVCache()
    fp16.update_and_fetch(k, v)
    assert cache.nbytes < (0.45 if bits == 4 else 0.34) * fp16.nbytes


def test_trim_into_a_group_is_exact_for_what_was_attended() -> None:
    q, k, v = data(300)
    cache = kivi(4, 32, 32)
    cache.update_and_fetch(k, v)
    cache.attend(q[:, :, -1:], SCALE, None)
    assert cache.rows is not None  # built by the first append
    assert cache.rows.quantized[0] == 256
    kept = 201  # inside the quantized group [192, 224)
    visible = mx.arange(300)[None] < kept  # [1, 300]: what the untrimmed cache shows a query at kept-1
    before = cache.attend(q[:, :, kept - 1 : kept], SCALE, visible)
    cache.trim(300 - kept)
    assert cache.offset == kept and cache.rows.quantized[0] == 192 and cache.rows.residual[0] == 9
    after = cache.attend(q[:, :, kept - 1 : kept], SCALE, None)
    assert float(mx.abs(after - before).max()) < 1e-5


@pytest.mark.parametrize("tokens, trim", [(20, 0), (300, 44), (300, 300 - 192)])
def test_state_round_trip_short_trimmed_and_group_aligned(tokens: int, trim: int, tmp_path: Path) -> None:
    q, k, v = data(tokens)
    cache = kivi(2, 32, 32)
    cache.update_and_fetch(k, v)
    cache.attend(q[:, :, -1:], SCALE, None)
    cache.trim(trim)
    path = str(tmp_path / "kivi.safetensors")
    save_prompt_cache(path, [cache])
    (loaded,) = load_prompt_cache(path)
    assert type(loaded) is KIVICache and loaded.offset == cache.offset == tokens - trim
    query = q[:, :, -1:]
    assert float(mx.abs(loaded.attend(query, SCALE, None) - cache.attend(query, SCALE, None)).max()) < 1e-6


def test_value_dimension_must_split_into_groups() -> None:
    cache = kivi(4, 64, 64)
    with pytest.raises(ValueError, match="kivi_group_size=64"):
        cache.update_and_fetch(mx.zeros((1, 1, 2, 96)), mx.zeros((1, 1, 2, 96)))
