"""`nbytes` counts every array a cache holds: walk every MLX array reachable from the cache object
(every method, several head dimensions, per-request and batched) and compare the sum."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from tests.kv.support import held_arrays
from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec
from veloxd.kv.factory import cache_class

N_KV, N_Q = 2, 8
SCALE = 0.125


def config_for(method: str, d: int) -> KVCacheConfig:
    """The method's defaults, with group sizes that divide d and budgets small enough to evict."""
    group = 64 if d % 64 == 0 else 32
    policy = registry.parts(method)[0]  # a hybrid (snapkv_affine) evicts like its policy
    fields: dict[str, Any] = {
        "affine": {"affine_group_size": group, "affine_rotate": True, "affine_key_bits": 8},
        "kivi": {"kivi_group_size": 32, "kivi_residual_length": 32},
        "qjl": {"qjl_value_group_size": group},
        "turboquant_mse": {"turboquant_outlier_channels": 32},
        "streaming_llm": {"streaming_llm_sinks": 4, "streaming_llm_window": 28},
        "knorm": {"knorm_budget": 32, "knorm_window": 8},
        "snapkv": {"snapkv_budget": 32, "snapkv_window": 8},
        "tova": {"tova_budget": 32},
        "h2o": {"h2o_budget": 32, "h2o_window": 8},
    }.get(policy, {})
    if registry.get(method).family == "hybrid":  # codes, scales, biases (keys 8-bit, values 4-bit), rotation
        fields |= {"affine_group_size": group, "affine_key_bits": 8, "affine_rotate": True}
    return KVCacheConfig(method=method, **fields)


def step(cache: Any, L: int, d: int, seed: int) -> None:
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    B = 1
    keys = mx.random.normal((B, N_KV, L, d), key=k1)
    values = mx.random.normal((B, N_KV, L, d), key=k2)
    queries = mx.random.normal((B, N_Q, L, d), key=k3)
    cache.update_and_fetch(keys, values)
    mx.eval(cache.attend(queries, SCALE, "causal" if L > 1 else None))


def filled(method: str, d: int, prompt: int, seed: int) -> Any:
    cache = cache_class(method)(config_for(method, d), LayerSpec(0, 2))
    step(cache, prompt, d, seed)
    for i in range(5):
        step(cache, 1, d, seed + 100 + i)
    return cache


def counted(cache: Any) -> tuple[int, int]:
    arrays = held_arrays(cache)
    mx.eval(arrays)
    return cache.nbytes, sum(a.nbytes for a in arrays)


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("method", [m for m in registry.names() if m != "fp16"])
def test_nbytes_is_every_array_held(method: str, d: int) -> None:
    cache = filled(method, d, 70, seed=d)
    nbytes, walked = counted(cache)
    assert nbytes == walked > 0
    if registry.get(method).batchable:
        batch = type(cache).merge([cache, filled(method, d, 45, seed=d + 1)])
        nbytes, walked = counted(batch)
        assert nbytes == walked > 0


def test_rotation_matrix_of_a_non_power_of_two_head_is_counted() -> None:
    """d = 96 rotates with MLX's 12-based Hadamard, which needs H^T as a [96, 96] float32 matrix."""
    cache = filled("turboquant_mse", 96, 40, seed=3)
    matrices = [a for a in held_arrays(cache) if a.shape == (96, 96)]
    assert len(matrices) == 2  # the key and value rotations
    assert cache.nbytes >= sum(a.nbytes for a in matrices) == 2 * 96 * 96 * 4
