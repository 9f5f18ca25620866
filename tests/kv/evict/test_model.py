"""Eviction caches on the tiny llama through mlx_lm's own generation loops: positions, batching, state.

The tiny random model mostly repeats one token greedily, so every comparison is on the full
next-token log-probabilities, not only on the tokens.
"""

from __future__ import annotations

import copy
import random

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import RotatingKVCache, load_prompt_cache, save_prompt_cache

from veloxd.kv import KVCacheConfig, make_caches

SMALL = {
    "streaming_llm": dict(streaming_llm_sinks=4, streaming_llm_window=36),
    "knorm": dict(knorm_budget=40, knorm_window=8),
    "snapkv": dict(snapkv_budget=40, snapkv_window=8),
    "tova": dict(tova_budget=40),
    "h2o": dict(h2o_budget=40, h2o_window=8),
}
LARGE = {  # budgets above every sequence here: nothing is ever evicted
    "streaming_llm": dict(streaming_llm_window=4096),
    "knorm": dict(knorm_budget=4096),
    "snapkv": dict(snapkv_budget=4096),
    "tova": dict(tova_budget=4096),
    "h2o": dict(h2o_budget=4096),
}


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(6, 512) for _ in range(n)]


def decode(model, tokens: list[int], cache: list, steps: int, **kwargs) -> tuple[list[int], mx.array]:
    """Greedy tokens and their log-probability vectors [steps, vocab] from mlx_lm's generate_step."""
    out = list(zip(range(steps), generate_step(mx.array(tokens), model, prompt_cache=cache, **kwargs)))
    return [int(t) for _, (t, _) in out], mx.stack([lp for _, (_, lp) in out])


def max_diff(a: mx.array, b: mx.array) -> float:
    return mx.abs(a - b).max().item()


@pytest.mark.parametrize("method,extra", [*((m, {}) for m in sorted(LARGE)), ("snapkv", {"snapkv_pyramid": True})])
def test_budget_above_the_sequence_equals_fp16(model, method: str, extra: dict) -> None:
    tokens = prompt(90, 1)
    ref_tokens, ref = decode(model, tokens, make_caches(model, KVCacheConfig(method="fp16")), 40, prefill_step_size=32)
    cache = make_caches(model, KVCacheConfig(method=method, **LARGE[method], **extra))
    got_tokens, got = decode(model, tokens, cache, 40, prefill_step_size=32)
    assert got_tokens == ref_tokens and max_diff(got, ref) < 1e-4
    assert all(c.size() == c.offset == 90 + 40 and not c.evicted[0] for c in cache)


def test_streaming_llm_decodes_like_mlx_rotating_cache(model) -> None:
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


def test_streaming_llm_prefill_chunking_changes_nothing(model) -> None:
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
def test_budget_holds_at_every_decode_step(model, method: str) -> None:
    cache = make_caches(model, KVCacheConfig(method=method, **SMALL[method]))
    limit = 40 + (8 if method == "snapkv" else 0)  # snapkv re-compresses once per window
    for i, _ in zip(range(60), generate_step(mx.array(prompt(70, 4)), model, prompt_cache=cache, prefill_step_size=32)):
        assert all(c.size() <= limit and c.offset == 70 + i + 1 for c in cache)
    assert all(c.evicted[0] and not c.is_trimmable() for c in cache)


def batched(model, config: KVCacheConfig, prompts: list[list[int]], max_tokens: list[int]):
    """mlx_lm's BatchGenerator with per-request veloxd caches: log-probs per request, cache classes seen."""
    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=32, prefill_batch_size=2, completion_batch_size=3)
    uids = gen.insert(prompts, max_tokens, caches=[make_caches(model, config) for _ in prompts])
    logprobs: dict[int, list[mx.array]] = {u: [] for u in uids}
    kinds: set[str] = set()
    while responses := gen.next_generated():
        kinds |= {type(c).__name__ for c in gen._generation_batch.prompt_cache}
        for r in responses:
            logprobs[r.uid].append(r.logprobs)
    gen.close()
    return [mx.stack(logprobs[u]) for u in uids], kinds


@pytest.mark.parametrize("method", sorted(SMALL))
def test_batched_decode_equals_single(model, method: str) -> None:
    config = KVCacheConfig(method=method, **SMALL[method])
    prompts = [prompt(n, 10 + n) for n in (70, 33, 55)]  # different lengths: padding, filter, extend
    max_tokens = [30, 12, 20]
    got, kinds = batched(model, config, prompts, max_tokens)
    assert kinds == {type(make_caches(model, config)[0]).batch_class.__name__}  # never mlx_lm's fp16 BatchKVCache
    for tokens, n, batch_logprobs in zip(prompts, max_tokens, got):
        _, single = decode(model, tokens, make_caches(model, config), n, prefill_step_size=32)
        assert max_diff(batch_logprobs, single) < 1e-4


@pytest.mark.parametrize("method", sorted(SMALL))
def test_state_round_trip_through_mlx_lm_files(model, method: str, tmp_path) -> None:
    cache = make_caches(model, KVCacheConfig(method=method, **SMALL[method]))
    decode(model, prompt(60, 5), cache, 7)  # evicted, and (snapkv) mid decode window
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, cache)
    loaded = load_prompt_cache(path)
    assert [type(c) for c in loaded] == [type(c) for c in cache]
    assert [(c.offset, c.size(), c.nbytes) for c in loaded] == [(c.offset, c.size(), c.nbytes) for c in cache]
    original = copy.deepcopy(cache)
    next_tokens = prompt(20, 6)
    _, a = decode(model, next_tokens, original, 12, prefill_step_size=8)
    _, b = decode(model, next_tokens, loaded, 12, prefill_step_size=8)
    assert max_diff(a, b) == 0.0
