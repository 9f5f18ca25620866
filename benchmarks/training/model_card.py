"""Evaluate the shipped tiny model and write its MODEL_CARD.md (and model_eval.json beside it).

`python -m benchmarks.training.model_card [--model DIR]`: held-out loss vs a unigram baseline on the same
tokens, pass-key accuracy by depth at 1k tokens with the fp16 cache, late recall of identifiers
defined early in a file, and the realistic-keys variant check.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from benchmarks.data import PassKey, documents, long_held_out, tokenize
from benchmarks.kv.passkey import DEPTHS, accuracy_by_depth, trials
from benchmarks.model import ASSET, key_channel_stats, load, max_logit_difference, with_outlier_keys
from benchmarks.provenance import provenance

EVAL_LENGTH = 1024


def token_nll(model: Any, window: np.ndarray) -> np.ndarray:
    """Per-position NLL of window[1:] given its prefix (one forward pass, no cache)."""
    tokens = mx.array(window)[None]  # (1, L)
    logits = model(tokens[:, :-1])[0]  # (L - 1, vocab)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logprobs, tokens[0, 1:, None], axis=-1)[:, 0]  # (L - 1,)
    return -np.array(picked)


def unigram_nll(train_docs: list[np.ndarray], vocab: int, targets: np.ndarray) -> float:
    """Mean NLL of `targets` under add-one-smoothed training-split token frequencies."""
    counts = np.bincount(np.concatenate(train_docs), minlength=vocab).astype(np.float64) + 1.0
    return float(-np.log(counts[targets] / counts.sum()).mean())


def late_identifier_recall(nll_windows: list[tuple[np.ndarray, np.ndarray]], split: int) -> dict[str, float]:
    """Loss on tokens past `split` that already occurred before it vs tokens that did not.

    A model that uses long context predicts repeated identifiers far better than new ones.
    """
    seen: list[float] = []
    unseen: list[float] = []
    for window, nll in nll_windows:
        early = set(window[:split].tolist())
        for position in range(split, len(window) - 1):
            (seen if int(window[position + 1]) in early else unseen).append(nll[position])
    return {
        "nll_repeated": float(np.mean(seen)),
        "nll_new": float(np.mean(unseen)),
        "repeated_fraction": len(seen) / max(1, len(seen) + len(unseen)),
    }


def copy_loss(
    model: Any,
    vocab: int,
    gaps: tuple[int, ...] = (0, 100, 400),
    span: int = 30,
    trials_per_gap: int = 4,
    seed: int = 0,
) -> dict[str, float]:
    """Mean NLL on the second copy of a random-token span after a random-token gap.

    An induction (copying) head drives this toward 0; ln(vocab) is the uniform guess.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for gap in gaps:
        losses = []
        for _ in range(trials_per_gap):
            first = rng.integers(6, vocab, size=span)
            sequence = np.concatenate([first, rng.integers(6, vocab, size=gap), first])
            losses.append(token_nll(model, sequence)[-(span - 1) :].mean())  # copy tokens after its first
        out[str(gap)] = float(np.mean(losses))
    return out


def evaluate(path: Path, windows: int = 12, passkey_keys: int = 4) -> dict[str, Any]:
    bench = load(path)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    split = documents()
    held_out = tokenize(tokenizer, split["held_out"])
    train = tokenize(tokenizer, split["train"])
    eval_windows = [w for _, w in long_held_out(held_out, EVAL_LENGTH, windows)]
    nlls = [token_nll(bench.model, w) for w in eval_windows]
    targets = np.concatenate([w[1:] for w in eval_windows])
    all_nll = np.concatenate(nlls)
    vocab = bench.model.args.vocab_size
    late = np.concatenate([n[512:] for n in nlls])
    cases = trials(PassKey(tokenizer), eval_windows, EVAL_LENGTH, DEPTHS, passkey_keys, seed=1)
    from mlx_lm.models.cache import KVCache

    passkey = accuracy_by_depth(bench.model, lambda: [KVCache() for _ in bench.model.layers], cases)
    variant = with_outlier_keys(bench)
    probe = mx.array(eval_windows[0][:512])[None]  # (1, 512)
    return {
        "provenance": provenance(path),
        "held_out_tokens": len(targets),
        "held_out_windows": len(eval_windows),
        "held_out_files": len(held_out.docs),
        "held_out_nll": float(all_nll.mean()),
        "held_out_nll_positions_512_1023": float(late.mean()),
        "unigram_nll": unigram_nll(train.docs, vocab, targets),
        "late_identifier_recall": late_identifier_recall(list(zip(eval_windows, nlls)), 512),
        "passkey_fp16_1k": passkey,
        "copy_loss_by_gap": copy_loss(bench.model, vocab),
        "uniform_nll": float(np.log(vocab - 6)),
        "outlier_variant": {
            "max_abs_logit_diff": max_logit_difference(bench.model, variant.model, probe),
            "key_max_over_median": [
                key_channel_stats(bench.model, probe)["max_over_median"],
                key_channel_stats(variant.model, probe)["max_over_median"],
            ],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=ASSET)
    parser.add_argument("--note", action="append", default=[], help="a line for the card's run history (repeatable)")
    args = parser.parse_args(argv)
    result = evaluate(args.model)
    result["notes"] = args.note
    (args.model / "model_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    from benchmarks.training.model_card_text import render

    training = json.loads((args.model / "training.json").read_text())
    config = json.loads((args.model / "config.json").read_text())
    (args.model / "MODEL_CARD.md").write_text(render(config, training, result))
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
