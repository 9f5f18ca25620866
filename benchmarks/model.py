"""The benchmark models: the shipped tiny model (float32 on CPU) and its "realistic keys" variant.

The variant scales a few rotary pairs (i, i + D/2) of every layer's k_proj rows by `a` and the
matching q_proj rows by 1/a. RoPE rotates each pair by one angle, so scaling both members of a
pair equally commutes with it: q.k, hence the model's function, is unchanged, while the key
channels get heavy-tailed outliers like real LLMs have (kv-anchors 4.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from benchmarks.paths import ASSETS

ASSET = ASSETS / "tiny-llama"
OUTLIER_PAIRS = (3, 17, 40, 58)  # rotary pair indices i (< D/2) at head_dim 128, scaled in every layer and KV head
OUTLIER_SCALE = 20.0


@dataclass
class BenchModel:
    name: str  # "tiny-llama" or "tiny-llama+outliers"
    path: Path
    model: Any
    tokenizer: Any


def model_path(explicit: str | Path | None = None) -> Path:
    """The shipped model if present, else a random tiny model (development only)."""
    if explicit:
        return Path(explicit)
    if (ASSET / "model.safetensors").exists():
        return ASSET
    from testkit.tinymodel import write_tiny_model

    return write_tiny_model(Path(".cache") / "bench-random-tiny")


def load(path: Path) -> BenchModel:
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(str(path))[:2]  # (model, tokenizer): the config comes only with return_config
    model.set_dtype(mx.float32)  # CPU: float16 matmuls are far slower than float32
    mx.eval(model.parameters())
    return BenchModel(path.name, path, model, tokenizer)  # the shipped model's directory is tiny-llama


def outlier_rows(head_dim: int, n_heads: int, pairs: tuple[int, ...]) -> list[int]:
    """Output rows of a q/k projection for rotary pairs (i, i + D/2) in every head."""
    half = head_dim // 2
    if any(not 0 <= i < half for i in pairs):  # an index past the head would write outside the weight
        raise ValueError(f"rotary pair indices {pairs} must lie in [0, {half}) for head_dim {head_dim}")
    return [h * head_dim + j for h in range(n_heads) for i in pairs for j in (i, i + half)]


def outlier_pairs(head_dim: int, pairs: tuple[int, ...] = OUTLIER_PAIRS) -> tuple[int, ...]:
    """OUTLIER_PAIRS placed at the same fractions of the rotary spectrum for another head_dim."""
    return tuple(i * (head_dim // 2) // 64 for i in pairs)


def with_outlier_keys(
    bench: BenchModel, scale: float = OUTLIER_SCALE, pairs: tuple[int, ...] | None = None
) -> BenchModel:
    """A second, function-preserving copy of the model whose keys have outlier channels."""
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(str(bench.path))[:2]
    model.set_dtype(mx.float32)
    for layer in model.layers:
        attn = layer.self_attn
        if getattr(attn.rope, "traditional", False):
            raise ValueError("outlier variant assumes non-traditional RoPE (pairs i, i + D/2)")
        chosen = outlier_pairs(attn.head_dim) if pairs is None else pairs
        k_rows = outlier_rows(attn.head_dim, attn.n_kv_heads, chosen)
        q_rows = outlier_rows(attn.head_dim, attn.n_heads, chosen)
        k_factor = mx.ones((attn.k_proj.weight.shape[0], 1))  # (Hkv * D, 1)
        k_factor[mx.array(k_rows)] = scale
        q_factor = mx.ones((attn.q_proj.weight.shape[0], 1))  # (Hq * D, 1)
        q_factor[mx.array(q_rows)] = 1.0 / scale
        attn.k_proj.weight = attn.k_proj.weight * k_factor
        attn.q_proj.weight = attn.q_proj.weight * q_factor
    mx.eval(model.parameters())
    return BenchModel(bench.name + "+outliers", bench.path, model, tokenizer)


def max_logit_difference(a: Any, b: Any, tokens: mx.array) -> float:
    """Largest absolute difference of the two models' logits on `tokens` [1, L] (float32)."""
    diff = mx.abs(a(tokens) - b(tokens)).max()
    return float(diff)


def key_channel_stats(model: Any, tokens: mx.array) -> dict[str, float]:
    """Max/median ratio of per-channel key RMS (post-RoPE) in layer 0: how heavy-tailed keys are."""
    from mlx_lm.models.cache import KVCache

    caches = [KVCache() for _ in model.layers]
    model(tokens, cache=caches)
    keys = caches[0].state[0]  # [1, Hkv, L, D]
    rms = mx.sqrt((keys.astype(mx.float32) ** 2).mean(axis=(0, 1, 2)))  # (D,)
    ordered = mx.sort(rms)
    return {"max_over_median": float(ordered[-1] / ordered[ordered.shape[0] // 2])}
