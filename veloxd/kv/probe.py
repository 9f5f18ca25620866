"""How a memory probe puts tokens into caches: a prompt, then generated tokens, as mlx_lm runs them.

A probe only needs each layer's cache to hold what it holds after n tokens, and a cache's bytes
depend on how many tokens it has seen and how they arrived (chunks, then one-token steps), not on
their values: packed codes, eviction slots and windows have fixed sizes. Two feeders:

- `Synthetic`: each layer's cache takes random keys and values of the model's own shapes (read
  from one fp16 token step) and attends with random queries, so eviction scores and stashes are
  exercised as in a real forward. No weights run: a first start costs attention only, where the
  model's forward (float16 matmuls) made most of it on a CPU. Used when every layer's own cache
  is mlx_lm's KVCache and the query heads are known.
- `Forward`: the model runs a fixed prompt (any other model: sliding windows, state-space layers).

tests/kv/test_footprint.py checks the synthetic figures against caches a model really filled,
for every method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx

PROMPT_CHUNK = 512  # probe prompts run in chunks, as mlx_lm prefills (smaller than its 2048)


@dataclass(frozen=True)
class LayerShape:
    """One layer's keys [B, k_heads, T, k_dim] and values [B, v_heads, T, v_dim], as KVCache holds them."""

    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int
    dtype: mx.Dtype


class Feeder(Protocol):
    def feed(self, caches: list[Any], start: int, stop: int) -> None:
        """Positions [start, stop) of the probe sequence through every layer, as one forward."""


class Forward:
    """The model itself, on a fixed, varied prompt."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.vocab = int(getattr(getattr(model, "args", None), "vocab_size", 0) or 256)

    def feed(self, caches: list[Any], start: int, stop: int) -> None:
        tokens = (mx.arange(start, stop) * 7919 % self.vocab)[None]  # [1, stop - start]
        self.model(tokens, cache=caches)


class Synthetic:
    """Random keys, values and queries of each layer's shapes, through the caches' own attention."""

    def __init__(self, shapes: list[LayerShape], q_heads: int) -> None:
        self.shapes = shapes
        self.q_heads = q_heads

    def feed(self, caches: list[Any], start: int, stop: int) -> None:
        n = stop - start
        key = mx.random.key(start)
        for cache, s in zip(caches, self.shapes):
            key, k_key, v_key, q_key = mx.random.split(key, 4)
            mask = cache.make_mask(n)  # as mlx_lm builds it: before this step's update
            keys = mx.random.normal((1, s.k_heads, n, s.k_dim), dtype=s.dtype, key=k_key)
            values = mx.random.normal((1, s.v_heads, n, s.v_dim), dtype=s.dtype, key=v_key)
            queries = mx.random.normal((1, self.q_heads, n, s.k_dim), dtype=s.dtype, key=q_key)
            cache.update_and_fetch(keys, values)
            cache.attend(queries, s.k_dim**-0.5, mask)


def query_heads(model: Any, shapes: list[LayerShape]) -> int | None:
    """The model's query heads when its config names them and they group every layer's key heads."""
    args = getattr(model, "args", None)
    for name in ("num_attention_heads", "n_heads", "n_head"):
        heads = getattr(args, name, None)
        if isinstance(heads, int) and heads > 0:
            return heads if all(heads % s.k_heads == 0 for s in shapes) else None
    return None


def run(feeder: Feeder, caches: list[Any], start: int, stop: int) -> None:
    """Positions [start, stop) as the end of a prompt: all but the last in chunks, then the last as a
    one-token step (as mlx_lm runs a prompt; SnapKV compresses and releases its stash there)."""
    for begin in range(start, stop - 1, PROMPT_CHUNK):
        feeder.feed(caches, begin, min(begin + PROMPT_CHUNK, stop - 1))
        mx.eval([c.state for c in caches])
    step(feeder, caches, stop - 1)


def step(feeder: Feeder, caches: list[Any], position: int) -> None:
    """One token at `position` (a prompt's last token, or a generated one)."""
    feeder.feed(caches, position, position + 1)
    mx.eval([c.state for c in caches])
