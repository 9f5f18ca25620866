"""Helpers for the eviction tests on a model: settings by budget, prompts, mlx_lm's decoding loops."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from veloxd.kv import KVCacheConfig, make_caches


def budgets(budget: int, window: int) -> dict[str, dict[str, Any]]:
    """Each eviction policy's settings that keep `budget` tokens (streaming_llm: 4 sinks + the rest
    as its window), with a `window` of recent tokens where the policy has one."""
    return {
        "streaming_llm": dict(streaming_llm_sinks=4, streaming_llm_window=budget - 4),
        "knorm": dict(knorm_budget=budget, knorm_window=window),
        "snapkv": dict(snapkv_budget=budget, snapkv_window=window),
        "tova": dict(tova_budget=budget),
        "h2o": dict(h2o_budget=budget, h2o_window=window),
    }


SMALL = budgets(40, 8)  # evicts within the tests' 30-150-token prompts


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(6, 512) for _ in range(n)]


def decode(model: Any, tokens: list[int], cache: list[Any], steps: int, **kwargs: Any) -> tuple[list[int], mx.array]:
    """Greedy tokens and their log-probability vectors [steps, vocab] from mlx_lm's generate_step."""
    out = list(zip(range(steps), generate_step(mx.array(tokens), model, prompt_cache=cache, **kwargs)))
    return [int(t) for _, (t, _) in out], mx.stack([lp for _, (_, lp) in out])


def max_diff(a: mx.array, b: mx.array) -> float:
    return float(mx.abs(a - b).max())


def batched(
    model: Any, config: KVCacheConfig, prompts: list[list[int]], max_tokens: list[int]
) -> tuple[list[mx.array], set[str]]:
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


def assert_batched_decode_equals_single(model: Any, config: KVCacheConfig) -> None:
    """Three requests of different lengths (padding, filter, extend) batched by mlx_lm decode as each alone,
    in `config`'s own batch class in every layer (never mlx_lm's fp16 BatchKVCache).

    A batch computes its projections with other matrix shapes than a single request, so its keys
    differ from the single run's in the last float bits; a policy that ranks tokens may then evict
    the other one of two near-equal candidates, and the runs part from that step on. The random
    model repeats one token greedily, so ties are common (knorm: a repeated token's layer-0 keys
    have equal norms up to RoPE's rounding). A parting is let through only where the single run
    itself parts, by that step, under noise of that size (`parts_under_noise`); every step before
    the parting must match."""
    prompts = [prompt(n, 10 + n) for n in (70, 33, 55)]
    max_tokens = [30, 12, 20]
    got, kinds = batched(model, config, prompts, max_tokens)
    assert kinds == {type(make_caches(model, config)[0]).batch_class.__name__}
    for tokens, n, batch_logprobs in zip(prompts, max_tokens, got):
        _, single = decode(model, tokens, make_caches(model, config), n, prefill_step_size=32)
        step = first_parting(batch_logprobs, single)
        if step is not None:
            assert parts_under_noise(model, config, tokens, single, step), (
                f"{len(tokens)}-token request: batched and single part at step {step} of {n}, "
                "and no rounding-sized perturbation of the weights makes the single run part by then"
            )


def first_parting(a: mx.array, b: mx.array, tolerance: float = 1e-4) -> int | None:
    """The first step (row) where two log-probability sequences [steps, vocab] differ by more than `tolerance`."""
    apart = [bool(x) for x in mx.abs(a - b).max(axis=-1) >= tolerance]
    return apart.index(True) if True in apart else None


def parts_under_noise(
    model: Any, config: KVCacheConfig, tokens: list[int], single: mx.array, step: int, trials: int = 8
) -> bool:
    """Whether perturbing every weight by a few float32 roundings (relative 1e-7, the size of
    batching's differences) makes the single run part from itself at or before `step` in one of
    `trials` draws: a near tie decided by rounding by then."""
    weights = model.parameters()
    try:
        for seed in range(trials):
            key = mx.random.key(seed)

            def jitter(w: mx.array, key: mx.array = key) -> mx.array:  # bound now: B023
                if not mx.issubdtype(w.dtype, mx.floating):
                    return w
                return w * (1 + 1e-7 * mx.random.normal(w.shape, dtype=w.dtype, key=key))

            model.update(tree_map(jitter, weights))
            _, noisy = decode(model, tokens, make_caches(model, config), step + 1, prefill_step_size=32)
            if first_parting(noisy, single[: step + 1]) is not None:
                return True
        return False
    finally:
        model.update(weights)  # arrays are immutable: this is the model exactly as it was


def assert_budget_holds(model: Any, cache: list[Any], method: str, steps: int) -> None:
    """At every one of `steps` decode steps after a 70-token prompt, no layer holds more than the
    budget (snapkv: plus its re-compression window); at the end every layer has evicted."""
    limit = 40 + (8 if method.startswith("snapkv") else 0)
    for i, _ in zip(
        range(steps), generate_step(mx.array(prompt(70, 4)), model, prompt_cache=cache, prefill_step_size=32)
    ):
        assert all(c.size() <= limit and c.offset == 70 + i + 1 for c in cache)
    assert all(c.evicted[0] and not c.is_trimmable() for c in cache)


def assert_state_round_trip(model: Any, config: KVCacheConfig, directory: Path) -> None:
    """A cache that has evicted (and, for snapkv, sits mid decode window), saved to and loaded from
    mlx_lm's prompt-cache file, has the same classes, offsets, sizes and bytes, and decodes the same."""
    cache = make_caches(model, config)
    decode(model, prompt(60, 5), cache, 7)
    path = str(directory / "cache.safetensors")
    save_prompt_cache(path, cache)
    loaded = load_prompt_cache(path)
    assert [type(c) for c in loaded] == [type(c) for c in cache]
    assert [(c.offset, c.size(), c.nbytes) for c in loaded] == [(c.offset, c.size(), c.nbytes) for c in cache]
    next_tokens = prompt(20, 6)
    _, a = decode(model, next_tokens, copy.deepcopy(cache), 12, prefill_step_size=8)
    _, b = decode(model, next_tokens, loaded, 12, prefill_step_size=8)
    assert max_diff(a, b) == 0.0
