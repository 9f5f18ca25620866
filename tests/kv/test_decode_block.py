"""A decode step reads the whole stored form in one pass: same output as key blocks, constant graph.

For every method, at GQA ratios 1 to 16 and head dimensions 64 to 128 (80 only for the eviction
methods: the quantizers pack in 32-element groups and refuse it before load):
- one decode step over a cache of several blocks gives the same attention output as the previous
  path, the online softmax over 128-key blocks (a multiple of every KIVI group), computed here by
  setting that block size as the cache's `decode_block` (None when serving);
- the decode step's output graph (built lazily, counted with mx.export_to_dot before evaluation)
  has the same number of operations at three cache lengths (up to an elided slice), so its work per step is a constant
  number of MLX operations, not one per key block. Lloyd-Max TurboQuant is the stated exception
  (its codes are decoded before a matmul, a bounded block at a time: `decode_block`); its
  uniform-codebook form is counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec
from veloxd.kv.factory import cache_class

N_KV = 2
CONTEXT = 300  # 3 blocks of the 128-key reference (the last one partial), one pass for the decode step
REFERENCE_BLOCK = 128
SHAPES = [(1, 64), (2, 96), (7, 128), (16, 128)]  # GQA 1 to 16, head dims 64, 96, 128 (80: eviction, below)
EVICTION = [m for m in registry.names() if registry.get(m).family == "eviction"]
# d 96 is not a multiple of the 64-element default groups of affine and QJL's values
GROUPS_96 = {"affine": {"affine_group_size": 32}, "qjl": {"qjl_value_group_size": 32}}
GROUPS_96 |= {h.name: GROUPS_96["affine"] for h in registry.HYBRIDS}  # policies over affine codes
METHODS = [m for m in registry.names() if m != "fp16"]
CASES = [
    pytest.param(m, g, d, GROUPS_96.get(m, {}) if d == 96 else {}, id=f"{m}-gqa{g}-d{d}")
    for m in METHODS
    for g, d in SHAPES
]
CASES += [pytest.param(m, 4, 80, {}, id=f"{m}-gqa4-d80") for m in EVICTION]
CASES += [pytest.param("kivi", 8, 128, {"kivi_group_size": g}, id=f"kivi-group{g}") for g in (64, 128)]
UNIFORM = {"turboquant_codebook": "uniform"}
CASES += [pytest.param(m, 4, 128, UNIFORM, id=f"{m}-uniform") for m in ("turboquant_mse", "turboquant_prod")]


def filled(
    method: str,
    n_q: int,
    d: int,
    fields: dict[str, Any],
    context: int = CONTEXT,
    dtype: mx.Dtype = mx.float16,
    decode_block: int | None = None,
) -> Any:
    """A cache holding `context` tokens, filled as a server would: prefill chunks, each attended;
    its one-query reads in `decode_block` key blocks (None: the method's own, as when serving)."""
    cache = cache_class(method)(KVCacheConfig(method=method, **fields), LayerSpec(0, 1))
    cache.decode_block = decode_block
    key = mx.random.key(3)
    for start in range(0, context, 128):
        n = min(128, context - start)
        k1, k2, k3, key = mx.random.split(key, 4)
        keys = mx.random.normal((1, N_KV, n, d), key=k1).astype(dtype)
        values = mx.random.normal((1, N_KV, n, d), key=k2).astype(dtype)
        cache.update_and_fetch(keys, values)
        mx.eval(cache.attend(mx.random.normal((1, n_q, n, d), key=k3).astype(dtype), d**-0.5, "causal"))
    return cache


def step(n_q: int, d: int, dtype: mx.Dtype = mx.float16) -> tuple[mx.array, mx.array, mx.array]:
    k1, k2, k3 = mx.random.split(mx.random.key(7), 3)
    keys = mx.random.normal((1, N_KV, 1, d), key=k1).astype(dtype)
    values = mx.random.normal((1, N_KV, 1, d), key=k2).astype(dtype)
    queries = mx.random.normal((1, n_q, 1, d), key=k3).astype(dtype)
    mx.eval(keys, values, queries)
    return queries, keys, values


@pytest.mark.parametrize(("method", "gqa", "d", "fields"), CASES)
def test_one_pass_decode_equals_the_blocked_path(method: str, gqa: int, d: int, fields: dict[str, Any]) -> None:
    n_q = N_KV * gqa
    queries, keys, values = step(n_q, d)
    outs = []
    for decode_block in (None, REFERENCE_BLOCK):  # the one pass, then the previous path: fixed key blocks
        cache = filled(method, n_q, d, fields, decode_block=decode_block)  # the same tokens and decisions
        cache.update_and_fetch(keys, values)
        out = cache.attend(queries, d**-0.5, None)
        mx.eval(out, cache.arrays())
        outs.append(out.astype(mx.float32))
    assert outs[0].shape == (1, n_q, 1, d)
    # one softmax against an online softmax over blocks: equal up to float16 rounding of partial sums
    assert mx.allclose(outs[0], outs[1], atol=2e-3, rtol=2e-2).item(), mx.abs(outs[0] - outs[1]).max().item()


def graph_size(out: mx.array, path: Path) -> int:
    """Operations in the (unevaluated) graph that computes `out`."""
    mx.export_to_dot(str(path), out)
    return path.read_text().count("shape=rectangle")


COUNTED = [m for m in METHODS if m not in ("turboquant_mse", "turboquant_prod")]
COUNT_CASES = [pytest.param(m, {}, id=m) for m in COUNTED]
COUNT_CASES += [pytest.param(m, UNIFORM, id=f"{m}-uniform") for m in ("turboquant_mse", "turboquant_prod")]


@pytest.mark.parametrize(("method", "fields"), COUNT_CASES)
@pytest.mark.parametrize(("gqa", "d"), [(4, 64)])  # a graph's size depends on neither; filling 16 x 128 is slow
def test_decode_step_operations_do_not_grow_with_context(
    method: str, fields: dict[str, Any], gqa: int, d: int, tmp_path: Path
) -> None:
    n_q = N_KV * gqa
    # float32: a graph's size does not depend on the dtype, and CPU float16 kernels are slow to fill with
    queries, keys, values = step(n_q, d, mx.float32)
    sizes = []
    for context in (300, 1300):  # 2 and 10 blocks of the old blocked path: a per-block read would show
        cache = filled(method, n_q, d, fields, context, mx.float32)
        cache.update_and_fetch(keys, values)
        mx.eval(cache.arrays())
        out = cache.attend(queries, d**-0.5, None)  # built, not evaluated
        sizes.append(graph_size(out, tmp_path / "step.dot"))
        mx.eval(out)
    assert min(sizes) > 0
    # equal up to a slice or pad MLX elides when it covers a whole buffer (spare capacity or none);
    # a per-block read would add a dozen operations per 128 keys
    assert max(sizes) - min(sizes) <= 2, f"decode graph sizes {sizes} at 300 and 1300 tokens"


@pytest.mark.parametrize("method", METHODS)
def test_a_decode_block_set_on_the_cache_reads_the_step_in_key_blocks(method: str, tmp_path: Path) -> None:
    """What the comparison above relies on: the cache's `decode_block` reaches the attention. The
    block loop evaluates each of its 3 blocks (300 tokens) as it goes, leaving only the final
    normalization lazy; the method's own read is one lazy graph of the whole step, far larger (the
    block loop goes first: constants a first step builds lazily count against it)."""
    n_q, d = N_KV * 4, 64
    queries, keys, values = step(n_q, d, mx.float32)
    sizes = []
    for decode_block in (REFERENCE_BLOCK, None):
        cache = filled(method, n_q, d, {}, CONTEXT, mx.float32, decode_block)
        cache.update_and_fetch(keys, values)
        mx.eval(cache.arrays())
        out = cache.attend(queries, d**-0.5, None)  # built, not evaluated
        sizes.append(graph_size(out, tmp_path / "step.dot"))
        mx.eval(out)
    assert sizes[0] < sizes[1], f"decode graph sizes {sizes}: {REFERENCE_BLOCK}-key blocks, then the method's read"


def test_lloyd_max_decode_reads_bounded_blocks() -> None:
    """The exception, stated: Lloyd-Max codes are decoded a block of `decode_block` keys at a time."""
    cache = filled("turboquant_mse", 4, 128, {}, 1300)
    assert cache.codec.decode_block is not None and cache.codec.decode_block < 1300
    uniform = filled("turboquant_mse", 4, 128, UNIFORM, 1300)
    assert uniform.codec.decode_block is None
