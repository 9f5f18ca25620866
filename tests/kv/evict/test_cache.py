"""Eviction caches on constructed keys, values and queries: budgets, protected tokens, scoring, trim."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import pytest

from tests.kv.support import merged
from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec, int_list
from veloxd.kv.evict import attention
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache
from veloxd.kv.evict.slots import EMPTY
from veloxd.kv.evict.snapkv import pyramid_budgets
from veloxd.kv.factory import cache_class

N_KV, N_Q, D = 2, 4, 16
SCALE = D**-0.5
CONFIGS: dict[str, dict[str, Any]] = {
    "streaming_llm": dict(streaming_llm_sinks=4, streaming_llm_window=28),
    "knorm": dict(knorm_budget=32, knorm_window=8),
    "snapkv": dict(snapkv_budget=32, snapkv_window=8, snapkv_kernel=3),
    "tova": dict(tova_budget=32),
    "h2o": dict(h2o_budget=32, h2o_window=8),
}
ONE_LAYER = LayerSpec(0, 1)
WINDOW = {"streaming_llm": 28, "knorm": 8, "snapkv": 8, "h2o": 8, "tova": 0}
# Prefill chunks, decode steps, a second prompt chunk, more decode: every kind of step.
SCHEDULE = [20, 1, 1, 30, 5] + [1] * 40 + [17] + [1] * 12


def make(method: str, layer: LayerSpec = ONE_LAYER, **overrides: Any) -> EvictionCache:
    config = KVCacheConfig(method=method, **{**CONFIGS[method], **overrides})
    cache = cache_class(method)(config, layer)
    assert isinstance(cache, EvictionCache), type(cache)
    return cache


def tokens(n: int, seed: int) -> tuple[mx.array, mx.array, mx.array]:
    """Random keys [1, Hkv, n, D], values and queries [1, Hq, n, D]."""
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    return (
        mx.random.normal((1, N_KV, n, D), key=k1),
        mx.random.normal((1, N_KV, n, D), key=k2),
        mx.random.normal((1, N_Q, n, D), key=k3),
    )


def step(cache: EvictionCache, keys: mx.array, values: mx.array, queries: mx.array) -> mx.array:
    cache.update_and_fetch(keys, values)
    out = cache.attend(queries, SCALE, None)
    mx.eval(out, cache.state)
    return out


def retained(cache: EvictionCache) -> list[list[int]]:
    """Sorted positions kept by each KV head of row 0."""
    pos = cache.slots["positions"][0]  # [Hkv, width]
    return [sorted(p for p in int_list(head) if p != EMPTY) for head in pos]


def run_schedule(cache: EvictionCache, schedule: list[int]) -> Iterator[tuple[int, int, int]]:
    """Feed the schedule; yield (step length, tokens fed, tokens held during the step) after each."""
    fed = 0
    for i, n in enumerate(schedule):
        k, v, q = tokens(n, i)
        cache.update_and_fetch(k, v)
        during = cache.size()
        if n == 1:  # one row attends over its first `size` slots: the free ones must all be after them
            pos = cache.slots["positions"]
            assert mx.all(pos[..., :during] != EMPTY).item() and mx.all(pos[..., during:] == EMPTY).item()
        out = cache.attend(q, SCALE, None)
        mx.eval(out, cache.state)
        fed += n
        yield n, fed, during


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_budget_positions_and_protected_tokens_at_every_step(method: str) -> None:
    cache = make(method)
    window = WINDOW[method]
    evicted_seen = False
    previous = 1
    for n, fed, during in run_schedule(cache, SCHEDULE):
        heads = retained(cache)
        assert cache.offset == fed  # the true position, whatever was evicted
        assert all(len(h) == cache.size() for h in heads)  # every KV head keeps as many tokens
        assert all(len(set(h)) == len(h) and h[0] >= 0 and h[-1] < fed for h in heads)
        # snapkv lets decode grow by one window before it re-compresses, and holds a prompt whole
        # until it ends (the next one-token step)
        limit = cache.budget + (window if method == "snapkv" else 0)
        if n > 1 and method == "snapkv":
            assert cache.size() == during  # nothing evicted inside a prompt
        else:
            prompt_ended = method == "snapkv" and previous > 1  # the whole prompt was held until now
            assert cache.size() <= (limit if n == 1 else cache.budget) and (during <= limit + n or prompt_ended)
        previous = n
        assert cache.size() == fed or cache.evicted[0]
        assert cache.width <= cache.capacity_limit() or (method == "snapkv" and n > 1)
        recent = set(range(fed - min(window, fed), fed))
        assert all(recent <= set(h) for h in heads), "the recent window was evicted"
        if method == "streaming_llm":
            assert all(set(range(4)) <= set(h) for h in heads), "a sink was evicted"
            assert heads[0] == sorted(set(range(4)) | recent)
        evicted_seen = evicted_seen or fed > cache.size()
    assert evicted_seen and not cache.is_trimmable()


def test_snapkv_keeps_the_same_tokens_for_one_chunk_and_many() -> None:
    """The prompt is scored by its real last `snapkv_window` queries, whatever the chunking."""
    k, v, q = tokens(100, 3)

    def prefill(chunks: list[tuple[int, int]]) -> EvictionCache:
        cache = make("snapkv")
        for a, b in chunks:  # the prompt but its last token, as mlx_lm prefills it
            step(cache, k[:, :, a:b], v[:, :, a:b], q[:, :, a:b])
        assert cache.size() == 99 and not cache.evicted[0]  # nothing scored before the prompt ends
        step(cache, k[:, :, 99:], v[:, :, 99:], q[:, :, 99:])  # the prompt's last token ends it
        return cache

    one = prefill([(0, 99)])
    many = prefill([(0, 30), (30, 64), (64, 90), (90, 99)])
    assert one.size() == many.size() == 32 and one.evicted[0]
    assert retained(one) == retained(many)
    assert all(set(range(92, 100)) <= set(h) for h in retained(one))  # the observation window stays


def overwhelming(method: str, star: int = 5, n: int = 40) -> EvictionCache:
    """Token `star` has a key every query aligns with, far above the others; return the cache."""
    budget: dict[str, Any] = {"snapkv_budget": 16} if method == "snapkv" else {f"{method}_budget": 16}
    cache = make(method, **budget)
    k, v, _ = tokens(n, 7)
    axis = mx.zeros((D,)).at[0].add(1.0)
    k = mx.where(mx.arange(n)[:, None] == star, 6.0 * axis, k * 0.1)  # [1, Hkv, n, D]
    q = mx.broadcast_to(3.0 * axis, (1, N_Q, n, D)) + 0.1 * tokens(n, 8)[2]
    step(cache, k, v, q)
    for i in range(30):  # decode: more tokens, the same kind of query
        k1, v1, q1 = tokens(1, 100 + i)
        step(cache, k1 * 0.1, v1, 3.0 * axis[None, None, None] + 0.1 * q1)
    return cache


@pytest.mark.parametrize("method", ["snapkv", "tova", "h2o"])
def test_token_with_overwhelming_attention_survives(method: str) -> None:
    cache = overwhelming(method)
    assert cache.evicted[0] and cache.offset == 70
    assert all(5 in h for h in retained(cache)), f"{method} evicted the most attended token"


def test_knorm_evicts_the_same_token_for_its_large_norm() -> None:
    # The constructed token also has the largest key norm: a query-free method drops it, so the
    # survival above is the attention scoring at work, not an artefact of the construction.
    cache = overwhelming("knorm")
    assert cache.evicted[0] and all(5 not in h for h in retained(cache))


@pytest.mark.parametrize("method", ["streaming_llm", "knorm"])
def test_prefill_chunking_keeps_the_same_tokens(method: str) -> None:
    k, v, q = tokens(100, 3)
    one, split = make(method), make(method)
    step(one, k, v, q)
    start = 0
    for n in (13, 40, 1, 1, 45):
        step(split, k[:, :, start : start + n], v[:, :, start : start + n], q[:, :, start : start + n])
        start += n
    assert one.evicted[0] and retained(one) == retained(split)
    for i in range(20):  # decode continues identically
        k1, v1, q1 = tokens(1, 50 + i)
        assert mx.allclose(step(one, k1, v1, q1), step(split, k1, v1, q1), atol=1e-5)
    assert retained(one) == retained(split)
    kept = one.size()
    order = [mx.argsort(c.slots["positions"], axis=-1)[..., :kept] for c in (one, split)]  # free slots last
    keys = [mx.take_along_axis(c.slots["keys"], o[..., None], axis=2) for c, o in zip((one, split), order)]
    assert mx.array_equal(keys[0], keys[1])


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_trim_is_exact_until_eviction(method: str) -> None:
    k, v, q = tokens(60, 4)
    trimmed, fresh = make(method), make(method)
    step(trimmed, k[:, :, :25], v[:, :, :25], q[:, :, :25])
    assert trimmed.is_trimmable() and trimmed.trim(7) == 7
    step(fresh, k[:, :, :18], v[:, :, :18], q[:, :, :18])
    assert trimmed.offset == fresh.offset == 18 and retained(trimmed) == retained(fresh)
    assert trimmed.nbytes == fresh.nbytes  # the trimmed tokens were released, not hidden
    # Continue past the budget. Methods whose whole state is the kept tokens stay identical;
    # h2o's accumulators and snapkv's window still hold what the trimmed queries contributed.
    for start, stop in ((18, 30), (30, 31), (31, 59), (59, 60)):  # ends with a one-token step
        outs = [step(c, k[:, :, start:stop], v[:, :, start:stop], q[:, :, start:stop]) for c in (trimmed, fresh)]
        if method in ("streaming_llm", "knorm", "tova"):
            assert mx.allclose(outs[0], outs[1], atol=1e-5) and retained(trimmed) == retained(fresh)
    assert not trimmed.is_trimmable()
    with pytest.raises(ValueError, match="cannot be trimmed"):
        trimmed.trim(1)


def test_pyramid_budgets_decrease_with_the_same_average() -> None:
    for n_layers, budget, window, beta in ((2, 96, 16, 20), (7, 512, 32, 20), (32, 1024, 64, 5)):
        budgets = pyramid_budgets(budget, window, n_layers, beta)
        assert sum(budgets) == n_layers * budget
        assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1] >= window
    layers = [make("snapkv", LayerSpec(i, 4), snapkv_pyramid=True, snapkv_budget=40) for i in range(4)]
    assert [c.budget for c in layers] == pyramid_budgets(40, 8, 4, 20)
    k, v, q = tokens(100, 5)
    for c in layers:
        step(c, k[:, :, :99], v[:, :, :99], q[:, :, :99])
        step(c, k[:, :, 99:], v[:, :, 99:], q[:, :, 99:])  # the prompt ends: it is compressed
    assert [c.size() for c in layers] == [c.budget for c in layers]  # each layer its own budget


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_registry_batchable_flag_matches_the_class(method: str) -> None:
    # mlx_lm batches exactly when the per-request cache has a `merge` attribute.
    assert hasattr(cache_class(method), "merge") == registry.get(method).batchable


def test_left_padded_rows_see_only_their_own_tokens() -> None:
    k, v, q = tokens(5, 9)
    batch = merged([make("h2o"), make("h2o")])
    assert isinstance(batch, EvictionBatch), type(batch)
    batch.prepare(left_padding=[3, 0])
    assert batch.offset.tolist() == [-3, 0]  # RoPE puts row 0's first real token at position 0
    out = step(batch, *(mx.concatenate([a, a]) for a in (k, v, q)))  # [2, H, 5, D]: row 1 all real
    assert batch.offsets == [2, 5] and batch.counts == [2, 5]
    assert batch.slots["positions"][0, 0].tolist() == [EMPTY, EMPTY, EMPTY, 0, 1]
    alone = make("h2o")
    expected = step(alone, k[:, :, 3:], v[:, :, 3:], q[:, :, 3:])
    assert mx.allclose(out[:1, :, 3:], expected, atol=1e-5)
    assert mx.allclose(batch.slots["mass"][:1, :, 3:], alone.slots["mass"], atol=1e-5)
    row = batch.extract(0)  # an owned per-request cache without the padding
    assert type(row) is type(alone) and row.offset == 2 and retained(row) == retained(alone)


@pytest.mark.parametrize("n_q", [4, 64])
def test_weights_over_key_blocks_kept_or_recomputed_equal_dense_softmax(n_q: int) -> None:
    """A prefill chunk over several key blocks gets its weights from the kept exponentials when a
    query block's scores over all keys fit the score bound (4 query heads), else from a second
    pass (64 heads, 4,136 keys: under 32 rows would fit); both equal the dense softmax's."""
    from veloxd.kv.ops.blockwise import kept_weight_rows

    L, S = 40, 4136
    k1, k2, k3 = mx.random.split(mx.random.key(5), 3)
    k = mx.random.normal((1, N_KV, S, D), key=k1)
    v = mx.random.normal((1, N_KV, S, D), key=k2)
    q = mx.random.normal((1, n_q, L, D), key=k3)
    assert (kept_weight_rows(1, n_q, L, S, 512) is not None) == (n_q == 4)

    def reduce(probs: mx.array, qs: int, qe: int) -> mx.array:
        return probs.sum(axis=(2, 3))  # [B, Hkv, n]

    out, mass = attention.received(q, k, v, SCALE, "causal", reduce, block=512, one_span=False)
    causal = mx.arange(S - L, S)[:, None] >= mx.arange(S)[None]  # [L, S]
    grouped = q.reshape(1, N_KV, n_q // N_KV, L, D) * SCALE  # [B, Hkv, R, L, D]
    scores = mx.where(causal, grouped @ k[:, :, None].swapaxes(-1, -2), -mx.inf)  # [B, Hkv, R, L, S]
    assert mx.allclose(mass, mx.softmax(scores, axis=-1).sum(axis=(2, 3)), atol=1e-4)
    reference = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=causal)
    assert mx.allclose(out, reference, atol=1e-4)


def test_weights_in_query_and_key_blocks_equal_one_block() -> None:
    k, v, q = tokens(50, 11)
    weight = (mx.arange(50) % 7 != 0).astype(mx.float32)[None]  # some padding queries

    def reduce(probs: mx.array, qs: int, qe: int) -> mx.array:
        return (probs * weight[:, None, None, qs:qe, None]).sum(axis=(2, 3))

    whole = attention.received(q, k, v, SCALE, "causal", reduce)
    key_blocks = attention.received(q, k, v, SCALE, "causal", reduce, block=8, one_span=False)  # 7 key blocks
    query_blocks = attention.received(q, k, v, SCALE, "causal", reduce, block=1 << 19)  # 1 query a block
    one_span = attention.received(q, k, v, SCALE, "causal", reduce, block=8)  # dense keys: 1 span of 50
    for got in (key_blocks, query_blocks, one_span):
        assert mx.allclose(whole[0], got[0], atol=1e-4) and mx.allclose(whole[1], got[1], atol=1e-4)
    reference = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask="causal")
    assert mx.allclose(whole[0], reference, atol=1e-4)
    # every query's weights sum to one: the mass received sums to the number of real queries (per head)
    assert mx.allclose(whole[1].sum(axis=-1), mx.full((1, N_KV), weight.sum().item() * N_Q / N_KV), atol=1e-3)
