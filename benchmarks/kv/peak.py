"""Transient peak memory of one attention call, per method, as a multiple of the fp16 cache.

For each method: one layer's cache is filled to `context - chunk - WARM - 1` tokens, then MLX's
peak-memory counter is reset around one call of a prefill block (`chunk` new tokens appended and
attended); after WARM decode steps (so capacity steps taken after an unaligned prefill, as
mlx_lm's KVCache takes them, are not what is measured), around one decode step (the token that
reaches `context`). The figure is the peak
above the memory held before the call, divided by the bytes of an fp16 cache holding `context`
tokens of the same layer (one KV head group, batch 1). Quantizing caches are filled without
attention (their stored form does not depend on it); eviction caches attend while filling, since
that is when they evict. `--time N` also times N more decode steps (median seconds per step; the
cache grows by N tokens). A one-query step reads the whole cache in one pass
(veloxd.kv.ops.blockwise). Run:

    python -m benchmarks.kv.peak [--context 4096] [--gqa 16] [--head-dim 128] [--time 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.base import LayerSpec
from veloxd.kv.factory import cache_class

KV_HEADS = 2
WARM = 7


def _fill(cache: Any, context: int, n_kv: int, d: int, chunk: int, seed: int = 0) -> None:
    """Append `context` tokens in chunks (random keys/values); eviction caches also attend."""
    key = mx.random.key(seed)
    done = 0
    while done < context:
        n = min(chunk, context - done)
        k1, k2, k3, key = mx.random.split(key, 4)
        keys = mx.random.normal((1, n_kv, n, d), key=k1).astype(mx.float16)
        values = mx.random.normal((1, n_kv, n, d), key=k2).astype(mx.float16)
        queries = mx.random.normal((1, n_kv * _GQA[0], n, d), key=k3).astype(mx.float16)
        if hasattr(cache, "budget"):  # an eviction cache evicts after attention
            _call(cache, queries, keys, values)
        else:
            cache.update_and_fetch(keys, values)
            mx.eval(*_arrays(cache))
        done += n


_GQA = [1]


def _call(cache: Any, queries: mx.array, keys: mx.array, values: mx.array) -> mx.array:
    L = queries.shape[2]
    mask = "causal" if L > 1 else None
    if isinstance(cache, KVCache):
        k, v = cache.update_and_fetch(keys, values)
        out = mx.fast.scaled_dot_product_attention(queries, k, v, scale=queries.shape[-1] ** -0.5, mask=mask)
    else:
        cache.update_and_fetch(keys, values)
        out = cache.attend(queries, queries.shape[-1] ** -0.5, mask)
    mx.eval(out, *_arrays(cache))
    return out


def _arrays(cache: Any) -> list[mx.array]:
    state = cache.state
    return [a for a in (state if isinstance(state, (tuple, list)) else [state]) if isinstance(a, mx.array)]


def _peak_of(cache: Any, L: int, n_q: int, n_kv: int, d: int) -> int:
    key = mx.random.key(99)
    k1, k2, k3 = mx.random.split(key, 3)
    queries = mx.random.normal((1, n_q, L, d), key=k3).astype(mx.float16)
    keys = mx.random.normal((1, n_kv, L, d), key=k1).astype(mx.float16)
    values = mx.random.normal((1, n_kv, L, d), key=k2).astype(mx.float16)
    mx.eval(queries, keys, values)
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    _call(cache, queries, keys, values)
    return mx.get_peak_memory() - before


def make_cache(method: str) -> Any:
    if method == "fp16":
        return KVCache()
    return cache_class(method)(KVCacheConfig(method=method), LayerSpec(0, 1))


def _step_seconds(cache: Any, steps: int, n_q: int, n_kv: int, d: int) -> float | None:
    """Median wall time of `steps` decode steps (inputs made and evaluated outside the timing)."""
    times = []
    for i in range(steps):
        k1, k2, k3 = mx.random.split(mx.random.key(1000 + i), 3)
        queries = mx.random.normal((1, n_q, 1, d), key=k3).astype(mx.float16)
        keys = mx.random.normal((1, n_kv, 1, d), key=k1).astype(mx.float16)
        values = mx.random.normal((1, n_kv, 1, d), key=k2).astype(mx.float16)
        mx.eval(queries, keys, values)
        start = time.perf_counter()
        _call(cache, queries, keys, values)
        times.append(time.perf_counter() - start)
    return statistics.median(times) if times else None


def measure(method: str, context: int, gqa: int, d: int, chunk: int, steps: int = 0) -> dict[str, Any]:
    _GQA[0] = gqa
    n_kv = KV_HEADS
    fp16_bytes = context * n_kv * d * 2 * 2
    cache = make_cache(method)
    _fill(cache, context - chunk - WARM - 1, n_kv, d, chunk)
    prefill = _peak_of(cache, chunk, n_kv * gqa, n_kv, d)
    for _ in range(WARM):
        _peak_of(cache, 1, n_kv * gqa, n_kv, d)
    decode = _peak_of(cache, 1, n_kv * gqa, n_kv, d)
    step_s = _step_seconds(cache, steps, n_kv * gqa, n_kv, d)
    return {
        "method": method,
        "context": context,
        "gqa": gqa,
        "head_dim": d,
        "prefill_chunk": chunk,
        "fp16_cache_bytes": fp16_bytes,
        "prefill_peak_bytes": prefill,
        "decode_peak_bytes": decode,
        "prefill_peak_x_fp16": round(prefill / fp16_bytes, 3),
        "decode_peak_x_fp16": round(decode / fp16_bytes, 3),
        "decode_block": "one pass",
        "decode_step_s": step_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--gqa", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=512, help="prefill block measured (new tokens)")
    parser.add_argument("--methods", default=",".join(registry.names()))
    parser.add_argument("--time", type=int, default=0, help="decode steps to time after the peaks")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    print(
        f"{'method':<16} {'prefill x fp16':>14} {'decode x fp16':>14} {'step ms':>8}   (context {args.context}, "
        f"GQA {args.gqa}, d {args.head_dim}, decode in one pass)"
    )
    for method in args.methods.split(","):
        row = measure(method, args.context, args.gqa, args.head_dim, args.chunk, args.time)
        rows.append(row)
        step = f"{row['decode_step_s'] * 1e3:8.2f}" if row["decode_step_s"] is not None else f"{'-':>8}"
        print(f"{method:<16} {row['prefill_peak_x_fp16']:>14.3f} {row['decode_peak_x_fp16']:>14.3f} {step}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
