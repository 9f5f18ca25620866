"""One measured run of one arm on one document: prefill, memory, then teacher-forced decode.

Prefill is chunked like mlx_lm's generate (cache state evaluated per chunk, no logits), then the
remaining tokens are fed one at a time through the cache, collecting next-token log-probs.
Memory: prefill peak (reset around prefill), resident bytes after decode (eval, gc, clear_cache)
minus the pre-cache baseline, the caches' own `nbytes`, and the stored bytes: the tokens each
cache holds (its payload), float32 arrays counted at 2 bytes (this CPU run is float32;
deployments hold fp16/bf16 activations). Stored bytes leave out allocation slack for every cache
alike, so their ratios are per-token footprints at any length; the slack is in `nbytes`.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, QuantizedKVCache

PREFILL_STEP = 2048  # mlx_lm generate's default prefill_step_size


@dataclass
class Run:
    logprobs: np.ndarray  # (E, vocab) float32
    targets: np.ndarray  # (E,) int
    prefill_seconds: float
    decode_seconds: list[float]
    prefill_peak_bytes: int  # peak during prefill above the pre-cache active memory
    decode_peak_bytes: int  # largest peak of one decode step above the memory held before it
    resident_bytes: int  # active memory held by the caches after decode
    nbytes: int  # sum of the caches' own nbytes
    state_bytes_fp16: int  # state arrays, float32 counted at 2 bytes per element
    tokens_seen: int
    far: np.ndarray  # (E,) bool: target seen only in the first quarter of the prompt (see far_positions)


def settle() -> int:
    gc.collect()
    mx.clear_cache()
    return mx.get_active_memory()


def state_bytes_fp16(caches: list[Any]) -> int:
    total = 0
    for cache in caches:
        held = held_rows(cache)
        leaves = tree_flatten(cache.state)
        assert isinstance(leaves, list)  # without a destination, tree_flatten returns [(path, leaf), ...]
        for _, array in leaves:
            if isinstance(array, mx.array):
                if held is not None and array.ndim == 4:
                    array = array[..., :held, :]  # (B, H, held, D or packed D): the tokens, not the slack
                itemsize = 2 if array.dtype == mx.float32 else array.itemsize
                total += array.size * itemsize
    return total


def held_rows(cache: Any) -> int | None:
    """Rows of mlx_lm's KVCache or QuantizedKVCache that hold tokens (None: state is all payload).

    Their `state` is the whole buffer, grown in 256-token steps; veloxd's caches' state already
    ends at their last token. Counting mlx_lm's slack made every ratio over fp16 look smaller by up
    to 256 / tokens (23 % at 1,040 tokens).
    """
    return int(cache.offset) if type(cache) in (KVCache, QuantizedKVCache) else None


def cache_nbytes(caches: list[Any]) -> int:
    return int(sum(getattr(c, "nbytes", 0) for c in caches))


def prefill(model: Any, caches: list[Any], tokens: np.ndarray, step: int = PREFILL_STEP) -> None:
    """Feed `tokens` through the caches in chunks, evaluating cache state only (as mlx_lm does)."""
    for start in range(0, len(tokens), step):
        chunk = mx.array(tokens[start : start + step])[None]  # (1, chunk)
        model(chunk, cache=caches)
        mx.eval([c.state for c in caches])


def next_logprobs(model: Any, caches: list[Any], token: int) -> mx.array:
    logits = model(mx.array([[token]]), cache=caches)  # (1, 1, vocab)
    return logits[0, -1] - mx.logsumexp(logits[0, -1])


def far_positions(tokens: np.ndarray, prompt_len: int) -> np.ndarray:
    """Decode positions whose target token occurs in the prompt, but not in its last quarter or since.

    Only a cache that kept (or faithfully compressed) older tokens can copy such a token: the
    "identifier defined early, used late" probe for eviction at a 25 % budget when pass-key
    retrieval did not form.
    """
    recent_start = prompt_len - prompt_len // 4
    older = set(tokens[:recent_start].tolist())
    out = []
    for position in range(prompt_len, len(tokens)):
        target = int(tokens[position])
        out.append(target in older and target not in set(tokens[recent_start:position].tolist()))
    return np.asarray(out, dtype=bool)


def run_document(model: Any, make_caches: Any, tokens: np.ndarray, prompt_len: int) -> Run:
    """Prefill tokens[:prompt_len - 1], then feed tokens[prompt_len - 1 : -1] one at a time."""
    baseline = settle()
    caches = make_caches()
    mx.reset_peak_memory()
    start = time.perf_counter()
    prefill(model, caches, tokens[: prompt_len - 1])
    prefill_seconds = time.perf_counter() - start
    prefill_peak = mx.get_peak_memory() - baseline
    rows, decode_seconds, decode_peak = [], [], 0
    for position in range(prompt_len - 1, len(tokens) - 1):
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        start = time.perf_counter()
        logprobs = next_logprobs(model, caches, int(tokens[position]))
        mx.eval(logprobs)
        decode_seconds.append(time.perf_counter() - start)
        decode_peak = max(decode_peak, mx.get_peak_memory() - before)
        rows.append(logprobs)
    stacked = np.array(mx.stack(rows))  # (E, vocab)
    del rows, logprobs
    mx.eval([c.state for c in caches])
    resident = settle() - baseline
    run = Run(
        logprobs=stacked,
        targets=np.asarray(tokens[prompt_len:], dtype=np.int64),
        prefill_seconds=prefill_seconds,
        decode_seconds=decode_seconds,
        prefill_peak_bytes=int(prefill_peak),
        decode_peak_bytes=int(decode_peak),
        resident_bytes=int(resident),
        nbytes=cache_nbytes(caches),
        state_bytes_fp16=state_bytes_fp16(caches),
        tokens_seen=len(tokens) - 1,
        far=far_positions(tokens, prompt_len),
    )
    del caches
    settle()
    return run


def compare(reference: Run, run: Run) -> dict[str, np.ndarray]:
    """Per-position KL(ref || run), top-1 agreement and NLL of both, over the decoded positions."""
    p_log = reference.logprobs
    kl = (np.exp(p_log) * (p_log - run.logprobs)).sum(axis=-1)  # (E,)
    top1 = reference.logprobs.argmax(-1) == run.logprobs.argmax(-1)  # (E,)
    index = np.arange(len(run.targets))
    correct = run.logprobs.argmax(-1) == run.targets
    return {
        "far": run.far.astype(np.float64),
        "far_correct": (correct & run.far).astype(np.float64),
        "correct": correct.astype(np.float64),
        "kl": np.maximum(kl, 0.0),
        "top1": top1.astype(np.float64),
        "nll": -run.logprobs[index, run.targets],
        "nll_ref": -reference.logprobs[index, reference.targets],
    }
