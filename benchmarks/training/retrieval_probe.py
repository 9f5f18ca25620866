"""Whole-key pass-key accuracy while training: one batched forward pass, no cache.

Teacher-forced, a key counts when every answer token is the argmax given the prompt and the true
tokens before it, which is exactly when greedy decoding reproduces it (passkey.answer_token_hits).
Prompts are the benchmark's (data.PassKey) on held-out text, at fixed depths and seeds, so the
probe's figures follow one curve over a run; `retrieval_eval` remains the model's verdict.
"""

from __future__ import annotations

import random
from typing import Any

import mlx.core as mx
import numpy as np

from benchmarks.data import PassKey, TokenizedCorpus, long_held_out, random_key

PROBE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


class Probe:
    """Fixed held-out pass-key prompts at one context length, scored in one forward pass."""

    def __init__(self, passkey: PassKey, held_out: TokenizedCorpus, length: int, keys_per_depth: int = 4):
        rng = random.Random(length)
        filler = [w for _, w in long_held_out(held_out, length, 8)]
        rows, answers = [], []
        for index in range(len(PROBE_DEPTHS) * keys_per_depth):
            depth = PROBE_DEPTHS[index // keys_per_depth]
            prompt, answer = passkey.prompt(random_key(rng), filler[index % len(filler)], length, depth)
            rows.append(np.concatenate([prompt, answer]))
            answers.append(len(answer))
        width = max(len(r) for r in rows)
        # Right-padded with id 0: causal attention never lets padding reach the scored positions.
        self.tokens = np.stack([np.pad(r, (0, width - len(r))) for r in rows]).astype(np.int32)  # (n, width)
        self.spans = [(len(r) - a, len(r)) for r, a in zip(rows, answers)]  # answer [start, end) per row

    def token_hits(self, model: Any, batch: int = 4) -> list[np.ndarray]:
        """Per prompt, whether each answer token is the argmax (teacher-forced)."""
        hits = []
        for first in range(0, len(self.tokens), batch):
            tokens = mx.array(self.tokens[first : first + batch])  # (b, width)
            predicted = np.asarray(mx.argmax(model(tokens[:, :-1]), axis=-1))  # (b, width - 1)
            for row, (start, end) in enumerate(self.spans[first : first + batch]):
                # The logit at position p predicts token p + 1.
                hits.append(predicted[row, start - 1 : end - 1] == self.tokens[first + row, start:end])
        return hits

    def accuracy(self, model: Any) -> float:
        """Fraction of prompts whose whole key is retrieved."""
        return whole_key_accuracy(self.token_hits(model))


def whole_key_accuracy(hits: list[np.ndarray]) -> float:
    """Fraction of prompts whose answer tokens all hit."""
    return float(np.mean([row.all() for row in hits]))
