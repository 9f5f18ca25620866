"""Eviction caches on the tiny llama through mlx_lm's own generation loops: positions, batching, state.

The tiny random model mostly repeats one token greedily, so every comparison is on the full
next-token log-probabilities, not only on the tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import RotatingKVCache

from tests.kv.evict.support import (
    SMALL,
    assert_batched_decode_equals_single,
    assert_budget_holds,
    assert_state_round_trip,
    decode,
    max_diff,
    prompt,
)
from veloxd.kv import KVCacheConfig, make_caches

LARGE: dict[str, dict[str, Any]] = {  # budgets above every sequence here: nothing is ever evicted
    "streaming_llm": dict(streaming_llm_window=4096),
    "knorm": dict(knorm_budget=4096),
    "snapkv": dict(snapkv_budget=4096),
    "tova": dict(tova_budget=4096),
    "h2o": dict(h2o_budget=4096),
}


@pytest.mark.parametrize("method,extra", [*((m, {}) for m in sorted(LARGE)), ("snapkv", {"snapkv_pyramid": True})])
def test_budget_above_the_sequence_equals_fp16(model: Any, method: str, extra: dict[str, Any]) -> None:
    tokens = prompt(90, 1)
    ref_tokens, ref = decode(model, tokens, make_caches(model, KVCacheConfig(method="fp16")), 40, prefill_step_size=32)
    cache = make_caches(model, KVCacheConfig(method=method, **LARGE[method], **extra))
    got_tokens, got = decode(model, tokens, cache, 40, prefill_step_size=32)
    assert got_tokens == ref_tokens and max_diff(got, ref) < 1e-4
    assert all(c.size() == c.offset == 90 + 40 and not c.evicted[0] for c in cache)


def test_streaming_llm_decodes_like_mlx_rotating_cache(model: Any) -> None:
    # Both keep post-RoPE keys at their true positions: sinks + window + the current token.
    sinks, window = 4, 36
    tokens = prompt(30, 2)  # shorter than the rotating buffer: its prefill is plain causal
    rotating = [RotatingKVCache(max_size=sinks + window + 1, keep=sinks) for _ in model.layers]
    ref_tokens, ref = decode(model, tokens, rotating, 80)
    cache = make_caches(model, KVCacheConfig(method="streaming_llm", **SMALL["streaming_llm"]))
    got_tokens, got = decode(model, tokens, cache, 80)
    assert cache[0].evicted[0] and cache[0].offset == 30 + 80 and cache[0].size() == sinks + window
    assert got_tokens == ref_tokens and max_diff(got, ref) < 1e-4
    _, full = decode(model, tokens, make_caches(model, KVCacheConfig(method="fp16")), 80)
    assert max_diff(full, ref) > 0.1  # eviction changed the distributions: the match above is not trivial


def test_streaming_llm_prefill_chunking_changes_nothing(model: Any) -> None:
    tokens = prompt(150, 3)
    config = KVCacheConfig(method="streaming_llm", **SMALL["streaming_llm"])
    one, split = make_caches(model, config), make_caches(model, config)
    _, a = decode(model, tokens, one, 10, prefill_step_size=1024)
    _, b = decode(model, tokens, split, 10, prefill_step_size=7)
    assert max_diff(a, b) < 1e-4
    for c1, c2 in zip(one, split):
        o1, o2 = (mx.argsort(c.slots["positions"], axis=-1)[..., : c.size()] for c in (c1, c2))
        assert mx.array_equal(
            mx.take_along_axis(c1.slots["positions"], o1, axis=2), mx.take_along_axis(c2.slots["positions"], o2, axis=2)
        )
        k1, k2 = (mx.take_along_axis(c.slots["keys"], o[..., None], axis=2) for c, o in ((c1, o1), (c2, o2)))
        assert mx.allclose(k1, k2, atol=1e-4)


@pytest.mark.parametrize("method", sorted(SMALL))
def test_budget_holds_at_every_decode_step(model: Any, method: str) -> None:
    assert_budget_holds(model, make_caches(model, KVCacheConfig(method=method, **SMALL[method])), method, 60)


@pytest.mark.parametrize("method", sorted(SMALL))
def test_batched_decode_equals_single(model: Any, method: str) -> None:
    assert_batched_decode_equals_single(model, KVCacheConfig(method=method, **SMALL[method]))


@pytest.mark.parametrize("method", sorted(SMALL))
def test_state_round_trip_through_mlx_lm_files(model: Any, method: str, tmp_path: Path) -> None:
    assert_state_round_trip(model, KVCacheConfig(method=method, **SMALL[method]), tmp_path)
