"""The cache contract, checked for every quantization method in the registry whose module imports.

Real MLX arrays, the real tiny model, mlx_lm's own save/load and BatchGenerator; float32 on CPU.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, load_prompt_cache, save_prompt_cache

from tests.kv.support import (
    config_for,
    deep,
    fresh,
    greedy,
    held_arrays,
    kl,
    prefill,
    quantization_methods,
    resident_bytes_of,
    run_batched,
    top_bits,
)
from veloxd.kv import registry
from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.factory import cache_class, native_caches
from veloxd.kv.quant.tokencache import TokenQuantCache

METHODS = quantization_methods()
HEADS, DIM = 2, 128


@pytest.fixture(scope="module")
def lm(tiny_model: Path) -> tuple[Any, list[list[int]]]:
    """(model, prompts): the tiny model and three prompts of different lengths (~90, ~40, ~65 tokens)."""
    from mlx_lm import load

    from testkit.tinymodel import corpus

    model, tokenizer = load(str(tiny_model))[:2]
    text = " ".join(corpus()[:3])
    ids = tokenizer.encode(text)
    return model, [ids[:90], ids[200:240], ids[400:465]]


def random_kv(n: int, seed: int = 0) -> tuple[mx.array, mx.array]:
    mx.random.seed(seed)
    return mx.random.normal((1, HEADS, n, DIM)), mx.random.normal((1, HEADS, n, DIM))


def standalone(method: str, bits: int | None = None) -> VeloxCache:
    return cache_class(method)(config_for(method, bits), LayerSpec(0, 1))


@pytest.mark.parametrize("method", METHODS)
def test_registry_flags_match_the_class(method: str) -> None:
    info = registry.get(method)
    cls = cache_class(method)
    assert info.storage == "packed"
    assert issubclass(cls, VeloxCache)
    # mlx_lm's server batches a model iff every cache has `merge`: it must say what the registry says
    assert hasattr(cls, "merge") == info.batchable


@pytest.mark.parametrize("method", METHODS)
def test_bookkeeping_of_a_standalone_cache(method: str) -> None:
    cache = standalone(method)
    assert cache.empty() and cache.size() == 0 and cache.offset == 0 and cache.nbytes == 0
    keys, values = random_kv(40)
    cache.update_and_fetch(keys[:, :, :37], values[:, :, :37])
    cache.update_and_fetch(keys[:, :, 37:], values[:, :, 37:])
    assert not cache.empty() and cache.size() == 40 and cache.offset == 40
    assert not hasattr(cache, "bits"), "mlx_lm would route attention to its own quantized kernel"
    assert cache.make_mask(1) is None
    assert cache.make_mask(3) == "causal"
    assert cache.make_mask(3, return_array=True).shape == (3, 43)
    assert cache.is_trimmable() == (registry.get(method).trimmable == "yes")
    assert cache.nbytes == sum(a.nbytes for a in held_arrays(cache))


@pytest.mark.parametrize("method", METHODS)
def test_nbytes_is_what_stays_resident(method: str) -> None:
    keys, values = random_kv(1024)
    mx.eval(keys, values)

    def build() -> VeloxCache:
        cache = standalone(method)
        for start in range(0, 1024, 256):
            cache.update_and_fetch(keys[:, :, start : start + 256], values[:, :, start : start + 256])
        return cache

    cache, resident = resident_bytes_of(build)
    assert cache.nbytes == sum(a.nbytes for a in held_arrays(cache))
    # the allocator rounds each buffer up to its page size (4 KiB here): allow that much per array
    slack = 0.02 * cache.nbytes + 4096 * len(held_arrays(cache))
    assert abs(resident - cache.nbytes) <= slack, (resident, cache.nbytes)
    fp16_bytes = 2 * HEADS * 1024 * DIM * 2
    assert cache.nbytes < fp16_bytes


# Per-token codec caches only; the others (KIVI's per-channel groups) check their formula in their own file.
TOKEN_CODEC_METHODS = [p for p in METHODS if issubclass(cache_class(p.values[0]), TokenQuantCache)]


def test_token_codec_methods_are_found() -> None:
    assert TOKEN_CODEC_METHODS, METHODS


@pytest.mark.parametrize("method", TOKEN_CODEC_METHODS)
def test_stored_bytes_match_the_codec_bits(method: str) -> None:
    cache = standalone(method)
    assert isinstance(cache, TokenQuantCache)
    keys, values = random_kv(1024)
    cache.update_and_fetch(keys, values)
    assert cache.codec is not None  # built by the first append
    window = cache.window.arrays() if cache.window is not None else []  # fixed: recent_window tokens
    fixed = sum(a.nbytes for a in (*cache.codec.constants(), *window))
    analytic = HEADS * 1024 * cache.codec.bits_per_token() / 8
    assert abs(cache.nbytes - fixed - analytic) <= 0.05 * analytic


def generate_greedy(model: Any, cache: list[Any], prompt: list[int], n: int) -> tuple[list[int], list[mx.array]]:
    """mlx_lm's own generate_step (chunked prefill, state evaluation) with a given cache list."""
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=cache, prefill_step_size=32)
    pairs = [(token, logprobs) for token, logprobs in steps]
    return [int(t) for t, _ in pairs], [lp for _, lp in pairs]


@pytest.mark.parametrize("method", METHODS)
def test_greedy_decode_agrees_with_fp16_at_top_bits(lm: tuple[Any, list[list[int]]], method: str) -> None:
    model, prompts = lm
    reference, ref_lps = generate_greedy(model, native_caches(model), prompts[0], 10)
    cache = fresh(model, method, top_bits(method))
    tokens, lps = generate_greedy(model, cache, prompts[0], 10)
    assert all(isinstance(c, VeloxCache) for c in cache)
    assert tokens == reference
    # generic bound: qjl's keys stay a 1-bit sketch at any `bits` (measured 6e-3); affine 8 and kivi 4 are ~1e-4
    assert max(kl(a, b) for a, b in zip(ref_lps, lps)) < 0.02


@pytest.mark.parametrize("method", METHODS)
def test_state_round_trip_through_mlx_lm(lm: tuple[Any, list[list[int]]], method: str, tmp_path: Path) -> None:
    model, prompts = lm
    cache = fresh(model, method)
    prefill(model, cache, prompts[0], 32)
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, cache)
    loaded = load_prompt_cache(path)
    copied = copy.deepcopy(cache)
    assert [type(c) for c in loaded] == [type(c) for c in cache]
    assert [c.offset for c in loaded] == [c.offset for c in cache]
    expected = prefill(model, cache, prompts[1][:3], 3)
    for other in (loaded, copied):
        assert float(mx.abs(prefill(model, other, prompts[1][:3], 3) - expected).max()) < 1e-4


@pytest.mark.parametrize("method", METHODS)
def test_trim_then_continue_equals_fresh_prefill(lm: tuple[Any, list[list[int]]], method: str) -> None:
    model, prompts = lm
    prompt = prompts[0]
    kept = 50
    trimmed = fresh(model, method)
    prefill(model, trimmed, prompt, 32)
    assert all(c.trim(len(prompt) - kept) == len(prompt) - kept for c in trimmed)
    assert all(c.offset == kept for c in trimmed)
    shorter = fresh(model, method)
    prefill(model, shorter, prompt[:kept], 32)
    for token in prompt[kept : kept + 4]:
        a, b = prefill(model, trimmed, [token], 1), prefill(model, shorter, [token], 1)
        assert int(mx.argmax(a)) == int(mx.argmax(b))
        assert kl(b, a) < 5e-3


@pytest.mark.parametrize("method", METHODS)
def test_chunked_prefill_matches_one_shot(lm: tuple[Any, list[list[int]]], method: str) -> None:
    model, prompts = lm
    prompt = prompts[0]
    one_shot = prefill(model, fresh(model, method), prompt, len(prompt))
    chunked = prefill(model, fresh(model, method), prompt, 16)
    assert int(mx.argmax(one_shot)) == int(mx.argmax(chunked))
    assert kl(one_shot, chunked) < 5e-3


@pytest.mark.parametrize("method", METHODS)
def test_batched_equals_single(lm: tuple[Any, list[list[int]]], method: str) -> None:
    if not registry.get(method).batchable:
        pytest.skip(f"{method} is registered batchable=False")
    model, prompts = lm
    step, history = 16, 30
    # request 0 arrives with a cache that already holds a prefix (prefix reuse)
    prefix_cache = fresh(model, method)
    prefill(model, prefix_cache, prompts[0][:history], step)
    inputs = [prompts[0][history:], prompts[1], prompts[2], prompts[1][:17]]
    starts = [deep(prefix_cache), fresh(model, method), fresh(model, method), fresh(model, method)]
    budgets = [6, 3, 6, 5]  # request 1 finishes early (filter + extract); request 3 joins late (extend)
    singles = [greedy(model, deep(c), p, n, step) for c, p, n in zip(starts, inputs, budgets)]
    tokens, lps, classes, extracted = run_batched(model, inputs, [deep(c) for c in starts], budgets, step, late=1)
    for i, (single_tokens, single_lps) in enumerate(singles):
        assert tokens[i] == single_tokens, i
        assert max(float(mx.abs(a - b).max()) for a, b in zip(lps[i], single_lps)) < 1e-3, i
    assert classes and all(issubclass(t, VeloxCache) for t in classes), classes
    assert BatchKVCache not in classes
    per_request = cache_class(method)
    for i, cache in extracted.items():
        layers = [c for c in cache if isinstance(c, VeloxCache)]
        assert layers and all(type(c) is per_request for c in layers)
        already = starts[i][0].offset
        assert [c.offset for c in layers] == [already + len(inputs[i]) + budgets[i]] * len(layers), i
