"""Decode speed on a half-precision model: the shipped tiny-llama as it ships (float16 weights).

The speed benchmark (benchmarks/kv/speed.py) runs float32 models; this one serves what a user's
worker serves here, where MLX's CPU kernels for half-precision inputs differ from float32's
(docs/results.md, ninth session of the speed notes). A prompt of about 220 tokens, then decode
steps (a model call and an argmax), interleaved across caches round by round; medians in ms
and as speed ÷ fp16.

    python -m benchmarks.kv.half [--steps 40] [--rounds 3] [--methods affine,kivi,...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from benchmarks.provenance import mlx_version
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.factory import make_caches

MODEL = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"
METHODS = ("fp16", "affine", "kivi", "qjl", "turboquant_mse", "snapkv_affine")


def caches_for(model: Any, method: str) -> list[Any]:
    from mlx_lm.models.cache import make_prompt_cache

    return (
        make_prompt_cache(model)
        if method == "fp16"
        else make_caches(model, KVCacheConfig.from_dict({"method": method}))
    )


def step_times(model: Any, prompt: mx.array, method: str, steps: int) -> list[float]:
    """Seconds per decode step after the prompt, one cache of `method`."""
    cache = caches_for(model, method)
    logits = model(prompt[None], cache=cache)
    token = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(token)
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        token = mx.argmax(model(token[None], cache=cache)[:, -1], axis=-1)
        mx.eval(token)
        times.append(time.perf_counter() - began)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated; fp16 always runs")
    args = parser.parse_args(argv)
    from mlx_lm import load

    model, tokenizer = load(str(MODEL))[:2]
    prompt = mx.array(tokenizer.encode("the quick brown fox " * 24))
    methods = ["fp16", *[m for m in args.methods.split(",") if m and m != "fp16"]]
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.rounds):  # interleaved: a busy spell slows every cache alike
        for method in methods:
            samples[method] += step_times(model, prompt, method, args.steps)
    preload = os.environ.get("LD_PRELOAD") or "none"
    print(
        f"{MODEL.name} ({model.args.model_type}, float16 weights), {len(prompt)}-token prompt, MLX {mlx_version()} "
        f"on {mx.default_device()}, LD_PRELOAD={preload}; median of {args.rounds} x {args.steps} steps"
    )
    reference = statistics.median(samples["fp16"])
    for method in methods:
        median = statistics.median(samples[method])
        print(f"{method:<16} {median * 1e3:7.2f} ms  speed ÷ fp16 {reference / median:5.2f}")


if __name__ == "__main__":
    main()
