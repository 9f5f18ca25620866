"""Turn per-document runs into the reported figures for one (model variant, context, arm)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.kv.measure import Run, compare


@dataclass
class Samples:
    """Everything measured for one arm at one context on one model variant."""

    runs: list[Run] = field(default_factory=list)
    comparisons: list[dict[str, np.ndarray]] = field(default_factory=list)
    error: str | None = None

    def add(self, run: Run, reference: Run | None) -> None:
        self.runs.append(run)
        if reference is not None:
            self.comparisons.append(compare(reference, run))


def median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def bootstrap_mean(values: np.ndarray, seed: int = 0, rounds: int = 1000) -> tuple[float, float]:
    """95 % interval of the mean by resampling positions."""
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(rounds, len(values)), replace=True).mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def quality(samples: Samples) -> dict[str, Any]:
    if not samples.comparisons:
        return {}
    joined = {k: np.concatenate([c[k] for c in samples.comparisons]) for k in samples.comparisons[0]}
    low, high = bootstrap_mean(joined["kl"])
    return {
        "kl_mean": float(joined["kl"].mean()),
        "kl_mean_ci95": [low, high],
        "kl_p99": float(np.percentile(joined["kl"], 99)),
        "top1_agreement": float(joined["top1"].mean()),
        "ppl_ratio": float(np.exp(joined["nll"].mean() - joined["nll_ref"].mean())),
        "nll": float(joined["nll"].mean()),
        "positions": len(joined["kl"]),
        "next_token_accuracy": float(joined["correct"].mean()),
        # Targets only the evicted-early part of the prompt holds (measure.far_positions).
        "far_positions": int(joined["far"].sum()),
        "far_accuracy": float(joined["far_correct"].sum() / joined["far"].sum()) if joined["far"].sum() else None,
    }


def memory(samples: Samples) -> dict[str, Any]:
    runs = samples.runs
    if not runs:
        return {}
    per_token = lambda values: median([v / r.tokens_seen for v, r in zip(values, runs)])  # noqa: E731
    resident = [r.resident_bytes for r in runs]
    nbytes = [r.nbytes for r in runs]
    return {
        "stored_bytes_per_token": per_token([r.state_bytes_fp16 for r in runs]),
        "nbytes_per_token": per_token(nbytes),
        "resident_bytes_per_token": per_token(resident),
        "resident_over_nbytes": median([a / b for a, b in zip(resident, nbytes) if b]),
        "prefill_peak_bytes": median([r.prefill_peak_bytes for r in runs]),
        "decode_peak_bytes": median([r.decode_peak_bytes for r in runs]),
    }


def speed(samples: Samples) -> dict[str, Any]:
    runs = samples.runs
    if not runs:
        return {}
    prefill = [(r.tokens_seen - len(r.decode_seconds)) / r.prefill_seconds for r in runs]
    decode = [1.0 / float(np.median(r.decode_seconds)) for r in runs if r.decode_seconds]
    return {
        "prefill_tokens_per_s": median(prefill),
        "prefill_tokens_per_s_range": [min(prefill), max(prefill)],
        "decode_tokens_per_s": median(decode),
        "decode_tokens_per_s_range": [min(decode), max(decode)] if decode else None,
        "speed_runs": len(runs),
    }


def ratios(
    row: dict[str, Any], reference: dict[str, Any], reference_itemsize: int = 4, is_reference: bool = False
) -> dict[str, Any]:
    """Each figure over the fp16 arm's figure at the same context and variant.

    The reference cache holds `reference_itemsize`-byte elements in this run (float32 on CPU); its
    resident bytes are scaled to 2-byte elements, so `resident_vs_fp16` compares with a real fp16
    cache (conservative for compressed caches, whose float32 scales are counted at 4 bytes).
    """

    def over(key: str) -> float | None:
        a, b = row.get(key), reference.get(key)
        return float(a / b) if a is not None and b else None

    return {
        "stored_vs_fp16": over("stored_bytes_per_token"),
        "resident_vs_fp16": 1.0
        if is_reference
        else (over("resident_bytes_per_token") or 0) * reference_itemsize / 2 or None,
        "prefill_peak_vs_fp16": over("prefill_peak_bytes"),
        "decode_peak_vs_fp16": over("decode_peak_bytes"),
        "prefill_speed_vs_fp16": over("prefill_tokens_per_s"),
        "decode_speed_vs_fp16": over("decode_tokens_per_s"),
    }
