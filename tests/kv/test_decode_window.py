"""A decode step over packed codes and the recent window (veloxd.kv.quant.onepass) is exact.

- affine-4 with its 32-token window, at GQA 1 to 16 and head dims 64, 96 and 128, against an
  explicit reference: the stored codes dequantized in the test, the window's newest W positions
  replaced by their exact (rotated) keys and values, one softmax. Head dim 80 is refused by every
  affine group size (32, 64, 128) before load, so it has no case here.
- the cases where the window does not cover its W positions (after a trim, in a left-padded
  batch, with the window longer than the context) against the block loop's overlay path
  (veloxd.kv.ops.blockwise with 16-key blocks: the cache's `decode_block`), which reads the window
  slot by slot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import pytest

from tests.kv.support import merged
from veloxd.kv import KVCacheConfig
from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.factory import cache_class
from veloxd.kv.quant.affine import AffineCodec
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenQuantCache

N_KV = 2
CONTEXT = 300
W = 32
SHAPES = [(g, d) for g in (1, 2, 4, 8, 16) for d in (64, 96, 128)]
C = TypeVar("C", bound=VeloxCache)


def config(method: str, d: int, **fields: Any) -> KVCacheConfig:
    if method == "affine" and d == 96:
        fields.setdefault("affine_group_size", 32)  # 96 is not a multiple of the default 64
    return KVCacheConfig(method=method, recent_window=W, **fields)


def filled(cfg: KVCacheConfig, n_q: int, d: int, context: int = CONTEXT, seed: int = 3) -> TokenQuantCache:
    """A cache of `context` tokens, prefilled in attended 128-token chunks as a server does."""
    cache = cache_class(cfg.method)(cfg, LayerSpec(0, 1))
    assert isinstance(cache, TokenQuantCache), type(cache)
    key = mx.random.key(seed)
    for start in range(0, context, 128):
        n = min(128, context - start)
        k1, k2, k3, key = mx.random.split(key, 4)
        keys = mx.random.normal((1, N_KV, n, d), key=k1).astype(mx.float16)
        values = mx.random.normal((1, N_KV, n, d), key=k2).astype(mx.float16)
        cache.update_and_fetch(keys, values)
        mx.eval(cache.attend(mx.random.normal((1, n_q, n, d), key=k3).astype(mx.float16), d**-0.5, "causal"))
    return cache


def one_token(batch: int, n_q: int, d: int) -> tuple[mx.array, mx.array, mx.array]:
    k1, k2, k3 = mx.random.split(mx.random.key(7), 3)
    keys = mx.random.normal((batch, N_KV, 1, d), key=k1).astype(mx.float16)
    values = mx.random.normal((batch, N_KV, 1, d), key=k2).astype(mx.float16)
    return mx.random.normal((batch, n_q, 1, d), key=k3).astype(mx.float16), keys, values


def reference(cache: TokenQuantCache, queries: mx.array, scale: float) -> mx.array:
    """Softmax attention over the dequantized codes with the window's W newest positions exact."""
    codec, store, T = cache.codec, cache.store, cache.offset
    assert isinstance(codec, AffineCodec) and store is not None and cache.window is not None
    g = codec.group_size

    def dense(prefix: str, bits: int) -> mx.array:
        codes, scales, biases = (store[f"{prefix}_{n}"][:, :, :T] for n in ("codes", "scales", "biases"))
        return mx.dequantize(codes, scales.astype(mx.float32), biases.astype(mx.float32), group_size=g, bits=bits)

    keys, values = dense("k", codec.key_bits), dense("v", codec.value_bits)  # [1, Hkv, T, D]: test-only copies
    exact_k = cache.window.keys[:, :, -W:].astype(mx.float32)  # the W newest, in the rotated frame
    exact_v = cache.window.values[:, :, -W:].astype(mx.float32)
    keys = mx.concatenate([keys[:, :, : T - W], exact_k], axis=2)
    values = mx.concatenate([values[:, :, : T - W], exact_v], axis=2)
    B, n_q, _, d = queries.shape
    q = codec.rotate_queries(queries.astype(mx.float32)) * scale
    q = q.reshape(B, N_KV, n_q // N_KV, d)  # [B, Hkv, R, D]
    weights = mx.softmax(q @ keys.swapaxes(-1, -2), axis=-1)  # [B, Hkv, R, T]
    return (weights @ values).reshape(B, n_q, 1, -1)


@pytest.mark.parametrize(("gqa", "d"), SHAPES, ids=[f"gqa{g}-d{d}" for g, d in SHAPES])
def test_affine_decode_with_window_equals_an_explicit_reference(gqa: int, d: int) -> None:
    n_q = N_KV * gqa
    cache = filled(config("affine", d), n_q, d)
    queries, keys, values = one_token(1, n_q, d)
    cache.update_and_fetch(keys, values)
    want = reference(cache, queries, d**-0.5)  # before attend: attend shrinks the window to W
    got = cache.attend(queries, d**-0.5, None).astype(mx.float32)
    assert got.shape == (1, n_q, 1, d)
    assert mx.allclose(got, want, atol=2e-3, rtol=2e-2).item(), mx.abs(got - want).max().item()


# The block loop's decode: 16-key blocks (fewer than any context here), the window read as an overlay.
BLOCK_LOOP = 16


def both_paths(make: Callable[[], C], step: Callable[[C], mx.array], dot: Path) -> list[mx.array]:
    """The decode output of the one-pass path and of the block loop, on equal fresh caches. The
    block loop did run: it evaluates each block as it goes, so the graph left to evaluate (written
    to `dot`) is only its final normalization, smaller than the one pass's whole lazy read. The
    block loop goes first: constants a first step builds lazily (rotations) count against it."""
    outs, sizes = [], []
    for decode_block in (BLOCK_LOOP, None):
        cache = make()
        cache.decode_block = decode_block  # None: the one pass, as when serving
        out = step(cache)
        mx.export_to_dot(str(dot), out)
        sizes.append(dot.read_text().count("shape=rectangle"))
        mx.eval(out)
        outs.append(out.astype(mx.float32))
    assert sizes[0] < sizes[1], f"decode graph sizes {sizes}: {BLOCK_LOOP}-key blocks, then one pass"
    return outs[::-1]


METHODS = ["affine", "turboquant_mse", "qjl"]
UNIFORM = {"turboquant_mse": {"turboquant_codebook": "uniform"}}  # its one-pass form (Lloyd-Max: blocks)


@pytest.mark.parametrize("method", METHODS)
def test_decode_after_a_trim_reads_rolled_out_slots_from_codes(method: str, tmp_path: Path) -> None:
    n_q, d = 8, 128
    queries, keys, values = one_token(1, n_q, d)

    def step(cache: TokenQuantCache) -> mx.array:
        cache.trim(5)  # the window's 5 newest slots go; its 5 oldest now hold nothing exact
        cache.update_and_fetch(keys, values)
        return cache.attend(queries, d**-0.5, None)

    got, want = both_paths(
        lambda: filled(config(method, d, **UNIFORM.get(method, {})), n_q, d), step, tmp_path / "step.dot"
    )
    assert mx.allclose(got, want, atol=2e-3, rtol=2e-2).item(), mx.abs(got - want).max().item()


@pytest.mark.parametrize("method", METHODS)
def test_batched_decode_with_left_padding_matches_the_block_loop(method: str, tmp_path: Path) -> None:
    n_q, d = 8, 128
    cfg = config(method, d, **UNIFORM.get(method, {}))
    queries, keys, values = one_token(2, n_q, d)

    def make() -> TokenQuantBatchCache:  # rows of 300 and 140 tokens: the shorter is left-padded by 160
        batch = merged([filled(cfg, n_q, d, CONTEXT, 3), filled(cfg, n_q, d, 140, 5)])
        assert isinstance(batch, TokenQuantBatchCache), type(batch)
        return batch

    def step(cache: TokenQuantBatchCache) -> mx.array:
        mask = cache.make_mask(1, return_array=True)
        cache.update_and_fetch(keys, values)
        return cache.attend(queries, d**-0.5, mask)

    got, want = both_paths(make, step, tmp_path / "step.dot")
    assert got.shape == (2, n_q, 1, d)
    assert mx.allclose(got, want, atol=2e-3, rtol=2e-2).item(), mx.abs(got - want).max().item()


def test_decode_with_a_window_longer_than_the_context(tmp_path: Path) -> None:
    n_q, d = 4, 64
    queries, keys, values = one_token(1, n_q, d)

    def step(cache: TokenQuantCache) -> mx.array:
        cache.update_and_fetch(keys, values)
        return cache.attend(queries, d**-0.5, None)

    def make() -> TokenQuantCache:  # 21 tokens: every one read exactly
        return filled(config("affine", d), n_q, d, context=20)

    got, want = both_paths(make, step, tmp_path / "step.dot")
    assert mx.allclose(got, want, atol=2e-3, rtol=2e-2).item(), mx.abs(got - want).max().item()
