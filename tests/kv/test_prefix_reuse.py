"""What mlx_lm's prompt cache gets back when it reuses a lossy cache, pinned at the cache level.

docs/caches.md ("Prefix reuse") says a reused cache is not always the state a fresh prefill of the
same tokens builds; each test below is one of the mechanisms it names, on real MLX arrays:
- a windowed quantizer trimmed by n tokens reads its n oldest window slots from codes;
- KIVI trimmed past its residual keeps the cut group's tokens as dequantized values and every
  earlier group as codes, where a fresh prefill keeps R..R+G-1 tokens exact; and a KIVI prompt
  prefilled in two chunks reads the first chunk's codes, where one chunk reads itself exactly;
- SnapKV trimmed before it evicted loses its stashed observation queries past the cut;
- mlx_lm extends any stored cache whose tokens prefix a new prompt, evicted ones included, so an
  eviction decided on an earlier prompt's observation window carries into the longer prompt.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache

from tests.kv.support import SCALE, data
from veloxd.kv.base import LayerSpec, int_list
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.evict.engine import EvictionCache
from veloxd.kv.evict.slots import EMPTY
from veloxd.kv.factory import cache_class
from veloxd.kv.quant.kivi import KIVICache
from veloxd.kv.quant.tokencache import TokenQuantCache

ONE_LAYER = LayerSpec(0, 1)


def feed(cache: Any, keys: mx.array, values: mx.array, queries: mx.array, start: int, stop: int) -> mx.array:
    """One model step over tokens [start, stop): store them, then attend with their queries."""
    cache.update_and_fetch(keys[:, :, start:stop], values[:, :, start:stop])
    out = cache.attend(queries[:, :, start:stop], SCALE, "causal" if stop - start > 1 else None)
    mx.eval(out, cache.state)
    return out


def test_affine_trim_past_the_window_reads_codes_where_a_fresh_prefill_reads_exact_values() -> None:
    q, k, v = data(300)
    config = KVCacheConfig(method="affine", recent_window=32)
    trimmed, fresh = (cache_class("affine")(config, ONE_LAYER) for _ in range(2))
    assert isinstance(trimmed, TokenQuantCache) and isinstance(fresh, TokenQuantCache)
    feed(trimmed, k, v, q, 0, 300)
    trimmed.trim(300 - 216)  # mlx_lm's longer-prompt path: back to a shorter request's prefix
    feed(fresh, k, v, q, 0, 216)
    assert trimmed.window is not None and fresh.window is not None
    assert trimmed.window.valid.sum().item() == 0 and fresh.window.valid.sum().item() == 32
    assert trimmed.codec is not None and trimmed.store is not None and fresh.store is not None
    for name in trimmed.codec.fields:  # the codes themselves trim exactly
        assert mx.array_equal(trimmed.store[name][:, :, :216], fresh.store[name][:, :, :216]).item(), name
    after_trim, after_fresh = (feed(c, k, v, q, 216, 217) for c in (trimmed, fresh))
    assert not mx.array_equal(after_trim, after_fresh).item()  # the 32 newest positions read codes


def kivi_cache() -> KIVICache:
    config = KVCacheConfig(method="kivi", bits=4, kivi_group_size=32, kivi_residual_length=128)
    return KIVICache(config, ONE_LAYER)


def test_kivi_trim_past_the_residual_holds_fewer_exact_tokens_than_a_fresh_prefill() -> None:
    q, k, v = data(400)
    trimmed, fresh = kivi_cache(), kivi_cache()
    feed(trimmed, k, v, q, 0, 400)
    trimmed.trim(400 - 216)
    feed(fresh, k, v, q, 0, 216)
    assert trimmed.rows is not None and fresh.rows is not None
    # fresh: R..R+G-1 newest tokens exact; trimmed: whole groups as codes, the cut group's 24
    # tokens dequantized into the residual
    assert (fresh.rows.quantized[0], fresh.rows.residual[0]) == (64, 152)
    assert (trimmed.rows.quantized[0], trimmed.rows.residual[0]) == (192, 24)
    after_trim, after_fresh = (feed(c, k, v, q, 216, 217) for c in (trimmed, fresh))
    assert not mx.allclose(after_trim, after_fresh, atol=1e-4).item()


def test_kivi_prompt_in_two_chunks_reads_the_first_chunk_from_codes() -> None:
    q, k, v = data(400)
    one, two = kivi_cache(), kivi_cache()
    whole = feed(one, k, v, q, 0, 400)  # one chunk attends to itself exactly
    feed(two, k, v, q, 0, 200)  # an earlier request's prompt, packed after its attention
    second = feed(two, k, v, q, 200, 400)  # the longer prompt extends it
    assert not mx.allclose(whole[:, :, 200:], second, atol=1e-4).item()


def snapkv(**fields: int) -> EvictionCache:
    config = KVCacheConfig.from_dict({"method": "snapkv", "snapkv_budget": 64, "snapkv_window": 8, **fields})
    cache = cache_class("snapkv")(config, ONE_LAYER)
    assert isinstance(cache, EvictionCache)
    return cache


def retained(cache: EvictionCache) -> list[list[int]]:
    return [sorted(p for p in int_list(head) if p != EMPTY) for head in cache.slots["positions"][0]]


def test_snapkv_trim_before_eviction_loses_the_stashed_observation_queries() -> None:
    q, k, v = data(300)
    trimmed, fresh = snapkv(), snapkv()
    feed(trimmed, k, v, q, 0, 299)  # a prompt but its last token: held whole, nothing evicted yet
    assert trimmed.is_trimmable()
    trimmed.trim(299 - 150)  # past its last 8 queries, the stash it would score with
    feed(fresh, k, v, q, 0, 150)
    assert int_list(trimmed.rows["stash_pos"][0]) == [-1] * 8
    assert sorted(int_list(fresh.rows["stash_pos"][0])) == list(range(142, 150))
    for cache in (trimmed, fresh):  # the next token ends the prompt: compress to the budget
        feed(cache, k, v, q, 150, 151)
    assert trimmed.evicted[0] and fresh.evicted[0]
    assert retained(trimmed) != retained(fresh)  # scored by 1 query instead of 8


def test_prompt_cache_extends_an_evicted_snapkv_cache_for_a_longer_prompt() -> None:
    """Not only exact repeats: mlx_lm's shorter-prefix path does not ask is_trimmable()."""
    q, k, v = data(300)
    earlier = snapkv()
    feed(earlier, k, v, q, 0, 149)
    feed(earlier, k, v, q, 149, 150)  # the prompt ends: compressed with its own last 8 queries
    assert earlier.evicted[0] and not earlier.is_trimmable()
    lru = LRUPromptCache(max_size=4)
    tokens = list(range(300))
    lru.insert_cache("m", tokens[:150], [earlier])
    reused, rest = lru.fetch_nearest_cache("m", tokens)
    assert reused is not None and len(rest) == 150 and reused[0].evicted[0]
    extended, fresh = reused[0], snapkv()
    feed(extended, k, v, q, 150, 299)
    feed(fresh, k, v, q, 0, 299)
    for cache in (extended, fresh):
        feed(cache, k, v, q, 299, 300)
    assert retained(extended) != retained(fresh)  # what the earlier prompt evicted never returns
