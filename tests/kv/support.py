"""Helpers for the quantized-cache tests: method parameters, greedy and batched decoding, memory."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from typing import Any, TypeVar

import mlx.core as mx
import pytest

from veloxd.kv import KVCacheConfig, make_caches, registry
from veloxd.kv.base import Batchable, VeloxCache

T = TypeVar("T")

# Small windows so short test prompts really reach the quantized form.
TEST_OVERRIDES: dict[str, dict[str, Any]] = {"kivi": {"kivi_group_size": 32, "kivi_residual_length": 32}}


def reference_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
    """Plain attention over dense keys/values [B, Hkv, S, D]: the exact reference."""
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def quantization_methods() -> list[Any]:
    """One pytest param per quantization method of the registry (an import error fails, never skips)."""
    return [pytest.param(name, id=name) for name in registry.names() if registry.get(name).family == "quantization"]


def config_for(method: str, bits: int | None = None, **fields: Any) -> KVCacheConfig:
    return KVCacheConfig(method=method, bits=bits, **{**TEST_OVERRIDES.get(method, {}), **fields})


def top_bits(method: str) -> int:
    return max(registry.get(method).bits_choices)


def logprobs_of(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def prefill(model: Any, cache: list[Any], tokens: list[int], step: int) -> mx.array:
    """Feed tokens in chunks of `step`; returns the log-probabilities after the last one [V]."""
    logits = None
    for start in range(0, len(tokens), step):
        logits = model(mx.array(tokens[start : start + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
    assert logits is not None, "no tokens to prefill"
    return logprobs_of(logits[0, -1])


def greedy(model: Any, cache: list[Any], prompt: list[int], n: int, step: int = 64) -> tuple[list[int], list[mx.array]]:
    """Greedy continuation of `prompt` through `cache`: tokens and their log-prob vectors.

    Chunks like mlx_lm (prompt[:-1] in `step`-token chunks, then the last token alone), so the
    result is comparable token for token with generate_step and BatchGenerator.
    """
    if len(prompt) > 1:
        prefill(model, cache, prompt[:-1], step)
    lp = prefill(model, cache, prompt[-1:], 1)
    tokens: list[int] = []
    lps: list[mx.array] = []
    for _ in range(n):
        token = int(mx.argmax(lp))
        tokens.append(token)
        lps.append(lp)
        lp = prefill(model, cache, [token], 1)
    return tokens, lps


def kl(p_log: mx.array, q_log: mx.array) -> float:
    """KL(p || q) of two log-probability vectors."""
    return float((mx.exp(p_log) * (p_log - q_log)).sum())


def fresh(model: Any, method: str, bits: int | None = None, **fields: Any) -> list[Any]:
    return make_caches(model, config_for(method, bits, **fields))


def held_arrays(obj: Any) -> list[mx.array]:
    """Every distinct mx.array reachable from obj through attributes, dicts, lists and tuples."""
    seen_objects: set[int] = set()
    arrays: dict[int, mx.array] = {}

    def walk(x: Any) -> None:
        if isinstance(x, mx.array):
            arrays[id(x)] = x
            return
        if id(x) in seen_objects or isinstance(x, (str, bytes, int, float, bool, type(None), type)):
            return
        seen_objects.add(id(x))
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "__dict__"):
            for v in vars(x).values():
                walk(v)

    walk(obj)
    return list(arrays.values())


def settle() -> int:
    """Active MLX memory after collecting garbage and dropping the buffer cache."""
    gc.collect()
    mx.clear_cache()
    return mx.get_active_memory()


def resident_bytes_of(build: Callable[[], T]) -> tuple[T, int]:
    """Build an object with `build()`, evaluate it, and return it with the memory it keeps resident."""
    before = settle()
    obj = build()
    mx.eval(held_arrays(obj))
    return obj, settle() - before


def run_batched(
    model: Any, prompts: list[list[int]], caches: list[list[Any]], max_tokens: list[int], step: int, late: int = 0
) -> tuple[dict[int, list[int]], dict[int, list[mx.array]], set[type], dict[int, list[Any]]]:
    """Drive mlx_lm's BatchGenerator; the last `late` prompts join after two decode steps (extend).

    Returns tokens and log-probs per prompt index, the cache classes seen at every decode step,
    and the per-request caches extracted when each request finished.
    """
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=max(max_tokens), prefill_step_size=step, completion_batch_size=8)
    early = len(prompts) - late
    uid_of = {}
    for i, uid in enumerate(gen.insert(prompts[:early], max_tokens=max_tokens[:early], caches=caches[:early])):
        uid_of[uid] = i
    tokens: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    lps: dict[int, list[mx.array]] = {i: [] for i in range(len(prompts))}
    extracted: dict[int, list[Any]] = {}
    classes: set[type] = set()
    steps = 0
    while True:
        responses = gen.next_generated()
        if not responses:
            break
        steps += 1
        classes |= {type(c) for c in gen._generation_batch.prompt_cache}
        for r in responses:
            tokens[uid_of[r.uid]].append(r.token)
            lps[uid_of[r.uid]].append(r.logprobs)
            if r.finish_reason is not None:
                extracted[uid_of[r.uid]] = r.prompt_cache
        if steps == 2 and late:
            new = gen.insert(prompts[early:], max_tokens=max_tokens[early:], caches=caches[early:])
            for j, uid in enumerate(new):
                uid_of[uid] = early + j
    gen.close()
    return tokens, lps, classes, extracted


def deep(cache: list[Any]) -> list[Any]:
    return copy.deepcopy(cache)


def merged(caches: list[Any]) -> VeloxCache:
    """One batch cache of per-request caches, as mlx_lm's BatchGenerator makes it: their class's `merge`."""
    cls = type(caches[0])
    assert issubclass(cls, Batchable), f"{cls.__name__} has no merge"
    return cls.merge(caches)


HEADS, DIM, SCALE = 2, 128, 128**-0.5
OUTLIER_CHANNELS = [3, 50, 77, 100]


def rel(a: mx.array, b: mx.array) -> float:
    return float(mx.linalg.norm(a - b) / mx.linalg.norm(b))


def data(n: int = 512, outliers: bool = False, seed: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    """queries [1, 4, n, D], keys/values [1, 2, n, D]; outliers scale a few key channels by 20."""
    mx.random.seed(seed)
    q = mx.random.normal((1, 2 * HEADS, n, DIM))
    k = mx.random.normal((1, HEADS, n, DIM))
    v = mx.random.normal((1, HEADS, n, DIM))
    if outliers:
        gain = mx.ones((DIM,))
        gain[mx.array(OUTLIER_CHANNELS)] = 20.0
        k = k * gain
    return q, k, v
