"""Pass-key retrieval by depth through a cache: a key hidden in held-out text, asked for at the end.

Greedy decoding of the answer tokens through the arm's caches; a trial passes when the decoded
tokens equal the key's tokens exactly. Same prompt format as the training segments (data.PassKey).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from benchmarks.data import PassKey, random_key
from benchmarks.kv.measure import prefill

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


def trials(
    passkey: PassKey,
    filler: list[np.ndarray],
    length: int,
    depths: tuple[float, ...],
    keys_per_depth: int,
    seed: int = 0,
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(depth, prompt ids, answer ids) for every trial; fillers rotate over held-out windows."""
    rng = random.Random(seed)
    out = []
    for d_index, depth in enumerate(depths):
        for k in range(keys_per_depth):
            text = filler[(d_index * keys_per_depth + k) % len(filler)]
            prompt, answer = passkey.prompt(random_key(rng), text, length, depth)
            out.append((depth, prompt, answer))
    return out


def answer_matches(model: Any, caches: list[Any], prompt: np.ndarray, answer: np.ndarray) -> bool:
    prefill(model, caches, prompt[:-1])
    token = int(prompt[-1])
    for expected in answer:
        logits = model(mx.array([[token]]), cache=caches)  # (1, 1, vocab)
        token = int(mx.argmax(logits[0, -1]))
        if token != int(expected):
            return False
    return True


def accuracy_by_depth(
    model: Any, make_caches: Callable[[], list[Any]], cases: list[tuple[float, np.ndarray, np.ndarray]]
) -> dict[str, Any]:
    hits: dict[float, list[bool]] = {}
    for depth, prompt, answer in cases:
        hits.setdefault(depth, []).append(answer_matches(model, make_caches(), prompt, answer))
    by_depth = {f"{d:.1f}": float(np.mean(v)) for d, v in sorted(hits.items())}
    total = [h for v in hits.values() for h in v]
    return {"by_depth": by_depth, "accuracy": float(np.mean(total)), "trials": len(total)}


def answer_token_hits(model: Any, caches: list[Any], prompt: np.ndarray, answer: np.ndarray) -> list[bool]:
    """Teacher-forced: is each answer token the argmax given the prompt and the true tokens before it?

    All True exactly when greedy decoding reproduces the answer (answer_matches), and the fraction
    still says how much of the key a cache keeps when the whole key is not retrieved.
    """
    prefill(model, caches, prompt[:-1])
    feed = np.concatenate([prompt[-1:], answer[:-1]])
    hits = []
    for token, expected in zip(feed, answer):
        logits = model(mx.array([[int(token)]]), cache=caches)  # (1, 1, vocab)
        hits.append(int(mx.argmax(logits[0, -1])) == int(expected))
    return hits
