"""Eviction over affine codes (the hybrid methods): attention from the packed slots, head dimensions,
trimming, batch moves. Real MLX arrays; the model-level checks are in test_quantized_model.py, the
registry and config errors in test_quantized_config.py."""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
import pytest

from tests.kv.support import held_arrays, merged, reference_attention
from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.evict.attention import visible
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache
from veloxd.kv.evict.packed import KEY_FIELDS, VALUE_FIELDS, AffineSlots
from veloxd.kv.factory import cache_class
from veloxd.kv.ops.blockwise import query_block
from veloxd.kv.preflight import check

HYBRIDS = [h.name for h in registry.HYBRIDS]

N_KV = 2
# Budgets small enough that a 70-token prompt and a few decode steps evict.
SMALL: dict[str, dict[str, Any]] = {
    "streaming_llm": {"streaming_llm_sinks": 4, "streaming_llm_window": 28},
    "knorm": {"knorm_budget": 32, "knorm_window": 8},
    "snapkv": {"snapkv_budget": 32, "snapkv_window": 8},
    "tova": {"tova_budget": 32},
    "h2o": {"h2o_budget": 32, "h2o_window": 8},
}


def config(method: str, d: int, bits: int = 4, rotate: bool = False) -> KVCacheConfig:
    group = 64 if d % 64 == 0 else 32  # mx.quantize groups must divide the head dimension
    policy = SMALL[registry.parts(method)[0]]
    return KVCacheConfig(method=method, bits=bits, affine_group_size=group, affine_rotate=rotate, **policy)


def dequantized_slots(cache: AffineSlots, n: int) -> tuple[mx.array, mx.array]:
    """Keys and values [B, Hkv, n, D] of the first n slots, decoded from the codes (the reference)."""
    cfg = cache.config
    key_bits = cfg.affine_key_bits or cfg.bit_width
    out = []
    for fields, bits in ((KEY_FIELDS, key_bits), (VALUE_FIELDS, cfg.bit_width)):
        codes, scales, biases = (cache.slots[f][:, :, :n] for f in fields)
        out.append(
            mx.dequantize(
                codes, scales.astype(mx.float32), biases.astype(mx.float32), group_size=cfg.affine_group_size, bits=bits
            )
        )
    return out[0], out[1]


def rel(a: mx.array, b: mx.array) -> float:
    return float(mx.linalg.norm(a - b) / mx.linalg.norm(b))


def check_steps(method: str, gqa: int, d: int, rotate: bool = False) -> None:
    """Prefill 70 tokens then 12 decode steps; every output equals dense attention over the decoded
    slots (rotated keys: with the queries rotated the same way, which leaves q.k unchanged)."""
    cache = cache_class(method)(config(method, d, rotate=rotate), LayerSpec(0, 2))
    assert isinstance(cache, AffineSlots), type(cache)  # a hybrid: eviction over affine codes
    n_q, scale = N_KV * gqa, d**-0.5
    keys = mx.random.normal((1, N_KV, 82, d), key=mx.random.key(d + gqa))
    values = mx.random.normal((1, N_KV, 82, d), key=mx.random.key(d + gqa + 1))
    queries = mx.random.normal((1, n_q, 82, d), key=mx.random.key(d + gqa + 2))
    cache.update_and_fetch(keys[:, :, :70], values[:, :, :70])
    rotated = cache.codec().rotate_queries(queries)  # unchanged without affine_rotate
    k_ref, v_ref = dequantized_slots(cache, 70)  # nothing evicted yet: slots hold the prompt in order
    pos = mx.arange(70)
    seen = visible(
        pos[None, None], pos[None], cache.window_rule()
    )  # [1, 1, 70, 70]: causal (streaming: sinks + window)
    expected = reference_attention(rotated[:, :, :70], k_ref, v_ref, scale, seen)
    assert rel(cache.attend(queries[:, :, :70], scale, "causal"), expected) < 1e-4
    for i in range(70, 82):
        cache.update_and_fetch(keys[:, :, i : i + 1], values[:, :, i : i + 1])
        n = cache.counts[0]  # one row: its retained tokens fill the first `count` slots at decode
        k_ref, v_ref = dequantized_slots(cache, n)
        expected = reference_attention(rotated[:, :, i : i + 1], k_ref, v_ref, scale, None)
        assert rel(cache.attend(queries[:, :, i : i + 1], scale, None), expected) < 1e-4, i
    assert cache.evicted[0] and cache.size() <= cache.capacity_limit()
    assert not {"keys", "values"} & set(cache.slots), "an fp16 copy of the retained tokens is held"


@pytest.mark.parametrize("rotate", [False, True], ids=["plain", "rotated"])
@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("gqa", [1, 2, 4, 8, 16])
def test_snapkv_affine_attends_from_the_codes_at_every_shape(gqa: int, d: int, rotate: bool) -> None:
    """GQA 16 x one decode query folds 16 rows: the dequantized-block path; below it, quantized_matmul.
    d = 96 rotates with a 12-based Hadamard matrix."""
    check_steps("snapkv_affine", gqa, d, rotate)


@pytest.mark.parametrize("method", HYBRIDS)
def test_every_hybrid_attends_from_the_codes(method: str) -> None:
    check_steps(method, 4, 128)


@pytest.mark.parametrize("method", HYBRIDS)
def test_retained_tokens_are_rows_of_codes_scales_and_biases(method: str) -> None:
    """Per-token groups: each slot holds D * bits / 32 code words and D / group scales and biases."""
    d = 128
    cache = cache_class(method)(config(method, d, bits=3), LayerSpec(0, 1))
    cache.update_and_fetch(mx.random.normal((1, N_KV, 70, d)), mx.random.normal((1, N_KV, 70, d)))
    cache.attend(mx.random.normal((1, N_KV * 2, 70, d)), d**-0.5, "causal")
    width = cache.width
    assert cache.slots["k_codes"].shape == cache.slots["v_codes"].shape == (1, N_KV, width, d * 3 // 32)
    assert cache.slots["k_codes"].dtype == mx.uint32
    for name in ("k_scales", "k_biases", "v_scales", "v_biases"):
        assert cache.slots[name].shape == (1, N_KV, width, d // 64) and cache.slots[name].dtype == mx.float16


@pytest.mark.parametrize("method", HYBRIDS)
def test_head_dims_the_groups_cannot_divide_are_refused_before_load(method: str) -> None:
    """mx.quantize needs groups of 32, 64 or 128 that divide the head: 80 never fits, 96 only with 32."""
    model_config = {"model_type": "llama", "head_dim": 80}
    for group in (32, 64, 128):
        kv = KVCacheConfig(method=method, affine_group_size=group)
        with pytest.raises(ValueError, match=f"affine_group_size={group} for method {method}: .* head dimension 80"):
            check(model_config, kv)
    with pytest.raises(ValueError, match="head dimension 96"):
        check({"model_type": "llama", "head_dim": 96}, KVCacheConfig(method=method))
    check({"model_type": "llama", "head_dim": 96}, KVCacheConfig(method=method, affine_group_size=32))


@pytest.mark.parametrize("method", HYBRIDS)
def test_trim_is_exact_until_eviction(method: str) -> None:
    """Trimming 5 of 20 codes rows gives what a cache fed 15 holds (per-token codes: nothing to requantize)."""
    d, scale = 128, 128**-0.5
    keys, values = mx.random.normal((1, N_KV, 21, d)), mx.random.normal((1, N_KV, 21, d))
    query = mx.random.normal((1, N_KV * 2, 1, d))
    trimmed, fresh = (cache_class(method)(config(method, d), LayerSpec(0, 1)) for _ in range(2))
    trimmed.update_and_fetch(keys[:, :, :20], values[:, :, :20])
    assert trimmed.is_trimmable() and trimmed.trim(5) == 5 and trimmed.offset == trimmed.size() == 15
    fresh.update_and_fetch(keys[:, :, :15], values[:, :, :15])
    for cache in (trimmed, fresh):
        cache.update_and_fetch(keys[:, :, 20:], values[:, :, 20:])
    assert mx.array_equal(trimmed.attend(query, scale, None), fresh.attend(query, scale, None))
    assert trimmed.nbytes == fresh.nbytes


def test_rotation_tames_outlier_key_channels() -> None:
    """Keys with a few channels 20x larger (tests.kv.support.data): per-token groups spend their range
    on the outliers, and the randomized Hadamard rotation spreads them (measured relative error of the
    attention output: 0.38 plain, 0.21 rotated; 4-bit values add the same error to both)."""
    from tests.kv.support import data

    q, k, v = data(200, outliers=True)  # queries [1, 4, 200, 128], keys/values [1, 2, 200, 128]
    exact = reference_attention(q, k, v, 128**-0.5, "causal")
    errors = {}
    for rotate in (False, True):
        cfg = KVCacheConfig(method="snapkv_affine", bits=4, affine_rotate=rotate, snapkv_budget=4096)
        cache = cache_class("snapkv_affine")(cfg, LayerSpec(0, 1))  # budget above the sequence: nothing evicted
        cache.update_and_fetch(k, v)
        errors[rotate] = rel(cache.attend(q, 128**-0.5, "causal"), exact)
    assert errors[True] < 0.7 * errors[False], errors


def feed(cache: VeloxCache, k: mx.array, v: mx.array, q: mx.array) -> mx.array:
    cache.update_and_fetch(k, v)
    return cache.attend(q, 128**-0.5, "causal" if q.shape[2] > 1 else None)


@pytest.mark.parametrize("method", [*HYBRIDS, "snapkv"])
def test_batch_moves_match_single_requests_while_evicting(method: str) -> None:
    """merge -> right-padded chunk -> evicting decode -> filter -> extend -> extract, row for row.
    Plain snapkv too: it pooled its scores in slot order, and a batch row's slots are not in position
    order, so batched rows kept other tokens (this test found it)."""
    d = 128
    cfg = config(method, d) if method in HYBRIDS else KVCacheConfig(method=method, **SMALL[method])
    cls = cache_class(method)
    assert issubclass(cls, EvictionCache), cls

    def rand(rows: int, n: int, seed: int) -> tuple[mx.array, mx.array, mx.array]:
        k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
        shape = (rows, N_KV, n, d)
        return (
            mx.random.normal(shape, key=k1),
            mx.random.normal(shape, key=k2),
            mx.random.normal((rows, 2 * N_KV, n, d), key=k3),
        )

    singles = [cls(cfg, LayerSpec(0, 1)) for _ in range(3)]
    for cache, n in zip(singles, (40, 0, 20)):
        if n:
            feed(cache, *rand(1, n, n))
    batch = merged(copy.deepcopy(singles))
    assert isinstance(batch, EvictionBatch), type(batch)

    def step(lengths: list[int], seed: int) -> None:
        width = max(lengths)
        k, v, q = rand(len(lengths), width, seed)
        if width > 1:
            batch.prepare(lengths=lengths, right_padding=[width - n for n in lengths])
        out = feed(batch, k, v, q)
        batch.finalize()
        for b, (single, n) in enumerate(zip(singles, lengths)):
            expected = feed(single, k[b : b + 1, :, :n], v[b : b + 1, :, :n], q[b : b + 1, :, :n])
            assert float(mx.abs(out[b : b + 1, :, :n] - expected).max()) < 1e-4, (seed, b)
        assert batch.offset.tolist() == [s.offset for s in singles]

    step([5, 12, 3], 100)  # right-padded prompt chunk
    for i in range(30):  # past every budget: each row evicts on its own
        step([1] * len(singles), 200 + i)
    assert all(s.evicted[0] for s in singles) and batch.evicted == [True, True, True]
    batch.filter([2, 0])
    singles = [singles[2], singles[0]]
    step([1, 1], 300)
    late = cls(cfg, LayerSpec(0, 1))
    feed(late, *rand(1, 50, 400))
    late_batch = merged([copy.deepcopy(late)])
    assert isinstance(late_batch, EvictionBatch), type(late_batch)
    batch.extend(late_batch)
    singles.append(late)
    for i in range(3):
        step([1, 1, 1], 500 + i)
    k, v, q = rand(1, 1, 600)
    for b, single in enumerate(singles):
        extracted = batch.extract(b)
        assert type(extracted) is cls and extracted.size() == single.size() and extracted.offset == single.offset
        assert float(mx.abs(feed(extracted, k, v, q) - feed(single, k, v, q)).max()) < 1e-4
    assert batch.nbytes == sum(a.nbytes for a in held_arrays(batch))


@pytest.mark.parametrize("method", ["snapkv_affine", "h2o_affine"])
def test_half_the_heads_attend_bit_for_bit_like_the_whole(method: str) -> None:
    """A tensor-parallel rank holds half the KV heads, so blockwise attention cuts its queries into
    other blocks (SCORE_ELEMENTS / (Hq x block) rows): the prompt here is one row past the first
    query block of the whole, and one block on the half. Packed or dense is chosen per call (as
    tests/distributed/test_head_split.py checks for the quantizers), so every row gets the same
    arithmetic, and policies that score per KV head keep the same tokens."""
    d, n_kv, ratio, block = 128, 2, 8, 1 << 14  # large key blocks: the score bound splits a short prompt
    rows = query_block(1, n_kv * ratio, 1 << 20, block)
    assert query_block(1, n_kv * ratio // 2, rows + 1, block) == rows + 1  # the half takes it whole
    prompt, total = rows + 1, rows + 1 + 40  # then decode past the budget (32)
    k1, k2, k3 = mx.random.split(mx.random.key(7), 3)
    keys = (2 * mx.random.normal((1, n_kv, total, d), key=k1)).astype(mx.float16)  # fp16, as served
    values = mx.random.normal((1, n_kv, total, d), key=k2).astype(mx.float16)
    queries = mx.random.normal((1, n_kv * ratio, total, d), key=k3).astype(mx.float16)
    whole, half = (cache_class(method)(config(method, d), LayerSpec(0, 1)) for _ in range(2))
    for cache in (whole, half):
        cache.block = block
    for start, stop in [(0, prompt), *((i, i + 1) for i in range(prompt, total))]:
        mask = "causal" if stop - start > 1 else None
        whole.update_and_fetch(keys[:, :, start:stop], values[:, :, start:stop])
        half.update_and_fetch(keys[:, :1, start:stop], values[:, :1, start:stop])
        out_whole = whole.attend(queries[:, :, start:stop], d**-0.5, mask)
        out_half = half.attend(queries[:, :ratio, start:stop], d**-0.5, mask)
        assert mx.array_equal(out_whole[:, :ratio], out_half), (start, stop)
    assert whole.evicted[0] and half.evicted[0]
