"""Attention supervision for the retrieval model: the induction circuit taught directly.

Retrieval in a transformer is a previous-token head feeding an induction head, which attends to
the token after an earlier occurrence of the current context and copies it (Olsson et al. 2022,
"In-context Learning and Induction Heads", arXiv:2209.11895). Trained from the LM loss alone the
circuit forms only after a plateau that grows with the context (Musat et al. 2025,
arXiv:2511.01033); measured here, from scratch on 2 cores: no induction after 400 steps at 192
tokens (docs/results.md). Deviation, ours: an auxiliary loss (cross-entropy of chosen heads'
attention against target positions) teaches the circuit's attention patterns; what the heads
write, and everything else, comes from the LM loss. The weights stay a plain llama checkpoint:
inference is mlx_lm's unchanged forward pass.

Guided heads (guided_heads(lookback); with GQA 4/2, query heads 0 and 1 share KV head 0):
- layer 0, heads 0 .. lookback - 1 attend to the token 1 .. lookback back. The induction head can
  only match as much context as the key it reads carries: the token after an earlier p knows
  tokens p .. p - lookback + 1, so lookback 2 matches a bigram and lookback 3 a trigram. A bigram
  cannot tell the runs in 38666 apart (after "3866" the earlier "66" is followed by "6" and by
  "."), a trigram can ("866" against "666");
- layer 1, head 0 (induction) attends to the token after an earlier occurrence of the current
  bigram, where there is one (other positions weigh 0). Which occurrence (INDUCTION_MATCHES):
  "bigram", the latest; "longest", the one whose preceding context matches longest (up to
  LONGEST_MATCH tokens), the latest of those. A pass-key prompt shows the key twice, followed by
  "." and by " is": after the question's "pass key is <key>", only the longest match points at
  the "." that the answer needs, where the latest bigram points at " is".
Only the last GUIDED_QUERIES query positions are guided: the guide's (queries x keys) scores cost
what the rest of a 4096-token step costs when every query is guided, and the far end of a long
sequence is where retrieval is asked.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def guided_heads(lookback: int = 2) -> tuple[tuple[int, int, str], ...]:
    """(layer, query head, target kind): layer 0's heads attend 1 .. lookback back, layer 1's head 0 is the induction head."""
    if lookback < 1:
        raise ValueError(f"lookback {lookback}: expected 1 or more tokens back")
    return tuple((0, n - 1, f"back_{n}") for n in range(1, lookback + 1)) + ((1, 0, "induction"),)


GUIDED_HEADS = guided_heads()  # what stages 1 to 5 of `make train-retrieval` were taught
GUIDED_QUERIES = 1024
INDUCTION_MATCHES = ("bigram", "longest")
LONGEST_MATCH = 8


def guide_targets(
    tokens: np.ndarray, induction: str = "bigram", heads: tuple[tuple[int, int, str], ...] = GUIDED_HEADS
) -> tuple[np.ndarray, np.ndarray]:
    """(heads, batch, guided queries) target key positions and weights for the inputs `tokens` (batch, length)."""
    batch, length = tokens.shape
    first = max(0, length - GUIDED_QUERIES)
    positions = np.arange(length)
    targets = np.zeros((len(heads), batch, length), np.int32)
    weights = np.zeros((len(heads), batch, length), np.float32)
    for index, (_, _, kind) in enumerate(heads):
        if kind.startswith("back_"):
            back = int(kind.removeprefix("back_"))
            targets[index], weights[index, :, back:] = np.maximum(positions - back, 0), 1.0
        else:
            for row in range(batch):
                targets[index, row], weights[index, row] = induction_targets(tokens[row], induction)
    return np.ascontiguousarray(targets[..., first:]), np.ascontiguousarray(weights[..., first:])


def induction_targets(row: np.ndarray, matches: str = "bigram") -> tuple[np.ndarray, np.ndarray]:
    """Per position i, 1 + an earlier p < i with (row[p-1], row[p]) == (row[i-1], row[i]), weight 1 where found.

    "bigram": the latest such p. "longest": the p whose context ending there matches the one
    ending at i for the most tokens (capped at LONGEST_MATCH), the latest among equals.
    """
    if matches not in INDUCTION_MATCHES:
        raise ValueError(f"induction matches {matches!r}: expected one of {', '.join(INDUCTION_MATCHES)}")
    longest = LONGEST_MATCH if matches == "longest" else 2
    targets = np.zeros(len(row), np.int32)
    weights = np.zeros(len(row), np.float32)
    # latest[n - 2]: each n-gram (n = 2..longest) -> the latest position it ends at
    latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(longest - 1)]
    ids = row.tolist()
    for i in range(1, len(ids)):
        grams = [tuple(ids[i - n + 1 : i + 1]) for n in range(2, min(longest, i + 1) + 1)]
        for gram in reversed(grams):  # longest first
            seen = latest[len(gram) - 2].get(gram)
            if seen is not None:
                targets[i], weights[i] = seen + 1, 1.0
                break
        for gram in grams:
            latest[len(gram) - 2][gram] = i
    return targets, weights


def guided_forward(
    model: nn.Module, inputs: mx.array, heads: tuple[tuple[int, int, str], ...] = GUIDED_HEADS
) -> tuple[mx.array, list[mx.array]]:
    """mlx_lm llama's forward pass, also returning the guided heads' attention log-probabilities.

    Same modules and arithmetic as mlx_lm.models.llama (checked against it in tests/kv's guide
    test); the guided heads' scores are recomputed from the same rotated queries and keys.
    """
    inner = model.model
    hidden = inner.embed_tokens(inputs)  # (batch, length, hidden)
    batch, length = inputs.shape
    first = max(0, length - GUIDED_QUERIES)
    causal = mx.triu(mx.full((length, length), -1e9, dtype=mx.float32), k=1)[first:]  # (guided queries, length)
    log_probs = []
    for layer_index, layer in enumerate(inner.layers):
        attention = layer.self_attn
        x = layer.input_layernorm(hidden)
        # (batch, length, heads * head_dim) -> (batch, heads, length, head_dim)
        queries = attention.q_proj(x).reshape(batch, length, attention.n_heads, -1).transpose(0, 2, 1, 3)
        keys = attention.k_proj(x).reshape(batch, length, attention.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = attention.v_proj(x).reshape(batch, length, attention.n_kv_heads, -1).transpose(0, 2, 1, 3)
        queries, keys = attention.rope(queries), attention.rope(keys)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=attention.scale, mask="causal")
        group = attention.n_heads // attention.n_kv_heads
        for guided_layer, head, _ in heads:
            if guided_layer == layer_index:
                # (batch, guided queries, head_dim) @ (batch, head_dim, length) -> (batch, guided queries, length)
                scores = queries[:, head, first:] @ keys[:, head // group].transpose(0, 2, 1)
                scores = scores * attention.scale + causal
                log_probs.append(scores - mx.logsumexp(scores, axis=-1, keepdims=True))
        hidden = hidden + attention.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    hidden = inner.norm(hidden)
    logits = model.lm_head(hidden) if hasattr(model, "lm_head") else inner.embed_tokens.as_linear(hidden)
    return logits, log_probs


def guided_loss(
    model: nn.Module,
    inputs: mx.array,
    targets: mx.array,
    mask: mx.array,
    head_targets: mx.array,
    head_weights: mx.array,
    guide_weight: float,
    heads: tuple[tuple[int, int, str], ...] = GUIDED_HEADS,
) -> tuple[mx.array, mx.array]:
    """(LM loss + guide_weight * mean attention loss, the attention loss alone)."""
    logits, log_probs = guided_forward(model, inputs, heads)
    ce = nn.losses.cross_entropy(logits, targets, reduction="none")  # (batch, length)
    lm = (ce * mask).sum() / mask.sum()
    attention = mx.array(0.0)
    for index, log_prob in enumerate(log_probs):
        # (batch, guided queries, length) -> (batch, guided queries)
        picked = mx.take_along_axis(log_prob, head_targets[index][..., None], axis=-1)[..., 0]
        weight = head_weights[index]
        attention = attention - (picked * weight).sum() / mx.maximum(weight.sum(), 1.0)
    attention = attention / len(log_probs)
    return lm + guide_weight * attention, attention
