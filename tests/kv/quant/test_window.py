"""The recent window (`recent_window`): the newest tokens read exactly, their codes still stored.

Real caches of every per-token codec, real MLX arrays (float32 on CPU), dense attention as the
reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from tests.kv import contract as kc
from tests.kv.support import reference_attention
from veloxd.kv.config import WINDOWED, KVCacheConfig, KVConfigError
from veloxd.kv.quant.tokencache import TokenQuantCache

SETTINGS: dict[str, dict[str, Any]] = {
    "affine": {"affine_rotate": True}
}  # the rotated frame must meet the window's keys too


def config(method: str, window: int, **fields: Any) -> KVCacheConfig:
    return KVCacheConfig(method, recent_window=window, **SETTINGS.get(method, {}), **fields)


def causal_out(cache: TokenQuantCache, q: mx.array, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
    """(cache output, dense output) of the last q.shape[2] positions under a causal mask."""
    return cache.attend(q, kc.SCALE, "causal"), reference_attention(q, keys, values, kc.SCALE, "causal")


@pytest.mark.parametrize("method", WINDOWED)
def test_a_window_covering_every_token_is_exact_attention(method: str) -> None:
    """Prefill chunk (causal, 12 queries) and a decode step, both with all 40 tokens in the window."""
    keys, values = kc.kv(40, seed=1)
    cache = kc.new_cache(config(method, 64))
    cache.update_and_fetch(keys[:, :, :39], values[:, :, :39])
    out, exact = causal_out(cache, kc.queries(12, seed=2), keys[:, :, :39], values[:, :, :39])
    assert mx.allclose(out, exact, atol=1e-5).item(), float(mx.abs(out - exact).max())
    cache.update_and_fetch(keys[:, :, 39:], values[:, :, 39:])
    q = kc.queries(1, seed=3)
    assert mx.allclose(cache.attend(q, kc.SCALE, None), reference_attention(q, keys, values, kc.SCALE, None), atol=1e-5)


@pytest.mark.parametrize("method", WINDOWED)
def test_the_window_lowers_the_error_and_only_by_reading_its_tokens(method: str) -> None:
    """A 32-token window beats none; a query that gives the newest tokens no weight sees no change."""
    errors = {w: kc.attention_error(config(method, w)) for w in (0, 32)}
    assert errors[32] < errors[0], errors
    keys, values = kc.kv(100, seed=6)
    q = kc.queries(1, seed=7)
    mask = mx.concatenate([mx.ones((1, 1, 1, 60), mx.bool_), mx.zeros((1, 1, 1, 40), mx.bool_)], axis=-1)
    outs = []
    for window in (0, 32):
        cache = kc.new_cache(config(method, window))
        cache.update_and_fetch(keys, values)
        outs.append(cache.attend(q, kc.SCALE, mask))  # the window's 32 positions are all masked
    assert mx.array_equal(outs[0], outs[1]).item()


@pytest.mark.parametrize("method", WINDOWED)
def test_window_bytes_are_counted_and_fixed(method: str) -> None:
    """nbytes = codes + W x (D + Dv) x itemsize + W flags, whatever the length past W."""
    sizes = []
    for n in (100, 200):
        keys, values = kc.kv(n, seed=8)
        with_window, without = kc.new_cache(config(method, 32)), kc.new_cache(config(method, 0))
        for cache in (with_window, without):
            cache.update_and_fetch(keys, values)
            cache.attend(kc.queries(1, seed=9), kc.SCALE, None)  # a call holds its chunk until attention
        sizes.append(with_window.nbytes - without.nbytes)
    expected = 32 * kc.HEADS * 2 * kc.DIM * 4 + 32  # float32 keys and values here, one bool per slot
    assert sizes == [expected, expected]


@pytest.mark.parametrize("method", WINDOWED)
def test_trim_keeps_codes_exact_and_the_window_refills(method: str) -> None:
    """Trim 10 then append 10: equal to a fresh prefill (the window refilled); append 5: the 5
    oldest slots read codes, so the output differs but only through those slots."""
    keys, values = kc.kv(60, seed=4)
    q = kc.queries(1, seed=5)

    def feed(cache: TokenQuantCache, start: int, stop: int) -> mx.array:
        """What a model step does: store the chunk, then attend (which lets the window drop it)."""
        cache.update_and_fetch(keys[:, :, start:stop], values[:, :, start:stop])
        return cache.attend(q, kc.SCALE, None)

    def after_trim(extra: int) -> tuple[mx.array, mx.array, TokenQuantCache]:
        trimmed, fresh = kc.new_cache(config(method, 16)), kc.new_cache(config(method, 16))
        feed(trimmed, 0, 40)
        assert trimmed.trim(10) == 10
        feed(fresh, 0, 30)
        return feed(trimmed, 40, 40 + extra), feed(fresh, 40, 40 + extra), trimmed

    same, fresh_out, refilled = after_trim(10)
    assert mx.array_equal(same, fresh_out).item()
    assert refilled.window is not None
    assert refilled.window.valid.sum().item() == 16
    differs, fresh_out, partial = after_trim(5)
    assert partial.window is not None
    assert partial.window.valid.sum().item() == 11
    assert not mx.array_equal(differs, fresh_out).item()


@pytest.mark.parametrize("method", WINDOWED)
def test_batched_rows_equal_their_single_caches_with_a_window(method: str) -> None:
    """Rows of 37 and 20 tokens (one longer, one shorter than the window) through merge and extract."""
    batched, single, batch = kc.batched_and_single(config(method, 24))
    assert batch.window is not None
    for got, expected in zip(batched, single):
        assert mx.allclose(got, expected, atol=1e-5).item()


@pytest.mark.parametrize("method", WINDOWED)
def test_window_survives_the_prompt_cache_round_trip(method: str, tmp_path: Path) -> None:
    cache, loaded, copied = kc.state_round_trip(config(method, 32), tmp_path / "c.safetensors")
    q = kc.queries(1, seed=9)
    expected = cache.attend(q, kc.SCALE, None)
    for other in (loaded, copied):
        assert other.window is not None
        assert mx.array_equal(other.attend(q, kc.SCALE, None), expected).item()


def test_window_applies_only_to_per_token_codecs() -> None:
    with pytest.raises(KVConfigError, match="recent_window"):
        KVCacheConfig("kivi", recent_window=8)
    with pytest.raises(KVConfigError, match="recent_window"):
        KVCacheConfig("affine", recent_window=-1)


@pytest.mark.parametrize("method", WINDOWED)
def test_chunking_does_not_change_what_a_query_reads(method: str) -> None:
    """The last 8 queries of a 40-token prompt: one chunk, a chunk of 8, or one token at a time,
    with a 16-token window (so each query's exact span crosses the chunk boundary)."""
    keys, values = kc.kv(40, seed=11)
    q = kc.queries(8, seed=12)

    def run(chunks: list[int]) -> mx.array:
        cache, start, outs = kc.new_cache(config(method, 16)), 0, []
        for size in chunks:
            stop = start + size
            cache.update_and_fetch(keys[:, :, start:stop], values[:, :, start:stop])
            wanted = q[:, :, max(0, start - 32) : stop - 32]  # the prompt's last 8 queries
            out = cache.attend(q[:, :, :size] if stop <= 32 else wanted, kc.SCALE, "causal")
            if stop > 32:
                outs.append(out[:, :, -wanted.shape[2] :])
            start = stop
        return mx.concatenate(outs, axis=2)

    one_chunk, two_chunks, tokens = run([40]), run([32, 8]), run([32] + [1] * 8)
    assert mx.allclose(one_chunk, two_chunks, atol=1e-5).item()
    assert mx.allclose(one_chunk, tokens, atol=1e-5).item()
