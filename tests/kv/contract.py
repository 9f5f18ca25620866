"""Cache-contract checks shared by the TurboQuant and QJL tests (helpers only, no tests here).

Each helper builds real caches from a KVCacheConfig, feeds real MLX arrays and returns what the
test asserts on; float32 on CPU, small shapes.
"""

from __future__ import annotations

import copy
import gc
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from tests.kv.support import merged, reference_attention
from veloxd.kv.base import LayerSpec
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.factory import cache_class
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenQuantCache

HEADS, Q_HEADS, DIM = 2, 4, 128
SCALE = DIM**-0.5


def kv(n: int, seed: int, outlier_scale: float = 1.0, batch: int = 1) -> tuple[mx.array, mx.array]:
    """Random keys/values [batch, HEADS, n, DIM]; optionally 4 key channels scaled up (outliers)."""
    key = mx.random.key(seed)
    k_key, v_key = mx.random.split(key)
    keys = mx.random.normal((batch, HEADS, n, DIM), key=k_key)
    channel_scale = mx.concatenate([mx.full((4,), outlier_scale), mx.ones((DIM - 4,))])
    return keys * channel_scale, mx.random.normal((batch, HEADS, n, DIM), key=v_key)


def queries(n: int, seed: int, batch: int = 1) -> mx.array:
    return mx.random.normal((batch, Q_HEADS, n, DIM), key=mx.random.key(seed))


def new_cache(config: KVCacheConfig, layer_index: int = 0) -> TokenQuantCache:
    cache = cache_class(config.method)(config, LayerSpec(layer_index, 4))
    assert isinstance(cache, TokenQuantCache), type(cache)  # the methods these helpers serve: per-token codecs
    return cache


def relative_error(approx: mx.array, exact: mx.array) -> float:
    return float(mx.linalg.norm(approx - exact) / mx.linalg.norm(exact))


def attention_error(config: KVCacheConfig, outlier_scale: float = 1.0, n: int = 200) -> float:
    """Relative error of the cache's attention output (4 queries after n keys) vs dense fp32."""
    keys, values = kv(n, seed=1, outlier_scale=outlier_scale)
    q = queries(4, seed=2)
    cache = new_cache(config)
    cache.update_and_fetch(keys, values)
    exact = reference_attention(q, keys, values, SCALE, None)
    return relative_error(cache.attend(q, SCALE, None), exact)


def state_round_trip(config: KVCacheConfig, path: Path) -> tuple[TokenQuantCache, TokenQuantCache, TokenQuantCache]:
    """(original, reloaded via mlx_lm's save/load_prompt_cache, deep copy as mlx_lm's server makes)."""
    keys, values = kv(70, seed=3)
    cache = new_cache(config)
    cache.update_and_fetch(keys, values)
    save_prompt_cache(str(path), [cache])
    (loaded,) = load_prompt_cache(str(path))
    assert isinstance(loaded, TokenQuantCache), type(loaded)
    return cache, loaded, copy.deepcopy(cache)


def trim_then_continue(config: KVCacheConfig) -> tuple[mx.array, mx.array, int]:
    """Outputs of (prefill 40, trim 10, append 5) and (prefill 30, append 5), and the trimmed count."""
    keys, values = kv(45, seed=4)
    q = queries(1, seed=5)
    trimmed = new_cache(config)
    trimmed.update_and_fetch(keys[:, :, :40], values[:, :, :40])
    n = trimmed.trim(10)
    trimmed.update_and_fetch(keys[:, :, 40:45], values[:, :, 40:45])
    fresh = new_cache(config)
    fresh.update_and_fetch(keys[:, :, :30], values[:, :, :30])
    fresh.update_and_fetch(keys[:, :, 40:45], values[:, :, 40:45])
    assert trimmed.offset == fresh.offset == 35
    return trimmed.attend(q, SCALE, None), fresh.attend(q, SCALE, None), n


def batched_and_single(config: KVCacheConfig) -> tuple[list[mx.array], list[mx.array], TokenQuantBatchCache]:
    """Per-row decode outputs from a merged batch and from the single caches (prompts 37 and 20)."""
    lengths = (37, 20)
    singles: list[TokenQuantCache] = []
    prompts: list[tuple[mx.array, mx.array]] = []
    for row, n in enumerate(lengths):
        keys, values = kv(n + 1, seed=10 + row)
        prompts.append((keys, values))
        cache = new_cache(config)
        cache.update_and_fetch(keys[:, :, :n], values[:, :, :n])
        singles.append(cache)
    batch = merged(singles)
    assert isinstance(batch, TokenQuantBatchCache), type(batch)
    step_k = mx.concatenate([k[:, :, n : n + 1] for (k, _), n in zip(prompts, lengths)])  # [2, H, 1, D]
    step_v = mx.concatenate([v[:, :, n : n + 1] for (_, v), n in zip(prompts, lengths)])
    q = queries(1, seed=20, batch=2)
    mask = batch.make_mask(1, return_array=True)
    batch.update_and_fetch(step_k, step_v)
    batched = batch.attend(q, SCALE, mask)
    single_out = []
    for row, cache in enumerate(singles):
        cache.update_and_fetch(step_k[row : row + 1], step_v[row : row + 1])
        single_out.append(cache.attend(q[row : row + 1], SCALE, None))
    return [batched[row : row + 1] for row in range(2)], single_out, batch


def stored_bits_per_element(config: KVCacheConfig, n: int = 512) -> tuple[float, float]:
    """(bits per K/V element actually held by the state arrays, the codec's analytic figure)."""
    keys, values = kv(n, seed=6)
    cache = new_cache(config)
    cache.update_and_fetch(keys, values)
    codec = cache.codec
    assert codec is not None  # built by the first append
    codes = cache.state[1 : 1 + len(codec.fields)]  # per-token arrays (the recent window is fixed bytes)
    held = sum(a.nbytes for a in codes) * 8
    elements = HEADS * n * (DIM + DIM)
    return held / elements, codec.bits_per_token() / (codec.k_dim + codec.v_dim)


def resident_bytes(config: KVCacheConfig, n: int = 1024) -> tuple[int, int]:
    """(growth of mx.get_active_memory while one cache holds n tokens, the cache's nbytes)."""
    keys, values = kv(n, seed=7)
    mx.eval(keys, values)
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    cache = new_cache(config)
    for start in range(0, n, 256):  # prefill in chunks, as mlx_lm does
        cache.update_and_fetch(keys[:, :, start : start + 256], values[:, :, start : start + 256])
        mx.eval(cache.state[1:])
    gc.collect()
    mx.clear_cache()
    return mx.get_active_memory() - before, cache.nbytes


TEXT = "The quick brown fox jumps over the lazy dog. " * 3 + "def add(a, b):\n    return a + b\n"


def teacher_forced_logits(model_path: Path, config: KVCacheConfig, prefill: int = 48) -> mx.array:
    """Logits [T, vocab] for every position of TEXT: `prefill` tokens in one call, then one by one.

    Exercises both attention paths (a multi-token prompt chunk, then single-token decode).
    """
    from veloxd.kv import make_caches

    model, tokenizer = _loaded(model_path)
    tokens = mx.array(tokenizer.encode(TEXT))[None]  # [1, T]
    caches = make_caches(model, config)
    logits = [model(tokens[:, :prefill], cache=caches)]
    for i in range(prefill, tokens.shape[1]):
        logits.append(model(tokens[:, i : i + 1], cache=caches))
    return mx.concatenate(logits, axis=1)[0].astype(mx.float32)  # [T, vocab]


def agreement_and_kl(reference: mx.array, logits: mx.array) -> tuple[float, float]:
    """(top-1 agreement, mean KL(reference || logits)) over positions."""
    agreement = float((mx.argmax(logits, -1) == mx.argmax(reference, -1)).mean())
    log_p = reference - mx.logsumexp(reference, -1, keepdims=True)
    log_q = logits - mx.logsumexp(logits, -1, keepdims=True)
    return agreement, float((mx.exp(log_p) * (log_p - log_q)).sum(-1).mean())


_MODELS: dict[Path, tuple[Any, Any]] = {}


def _loaded(model_path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of mlx_lm's load, once per path."""
    from mlx_lm import load

    if model_path not in _MODELS:
        _MODELS[model_path] = load(str(model_path))[:2]
    return _MODELS[model_path]
