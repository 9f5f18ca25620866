"""`make bench-speed`: decode and prefill speed of every cache, side by side in one run.

For each context (2k, 8k, 32k cached tokens; --quick: 2k and 8k) every arm's caches are filled by
prefill in 1024-token chunks (benchmarks/kv/speed_model.py), then decode is timed in 3 rounds of 12
single-token steps, interleaved step by step: each step of every arm (single request, then a batch
of 4) runs next to the same step of every other arm, and an arm's figure is the median over all
its steps. Prefill: the time of one
512-token chunk after a 1024-token prompt, interleaved the same way. Ratios are speeds relative to
fp16 and to mlx_lm's QuantizedKVCache 4-bit, both measured in the same rounds (> 1: faster).
Prints whether OpenBLAS was preloaded (LD_PRELOAD); --json writes benchmarks/results/speed.json.
`render(results)` turns the results dict into the table, so later columns (cold start) extend it.

    python -m benchmarks.kv.speed [--quick] [--json] [--arms fp16,mlx-q4,affine-4] [--contexts 2048] [--no-prefill]
                                  [--no-decode] [--prefill-rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from benchmarks.kv.arms import Arm
from benchmarks.kv.speed_model import arms as all_arms
from benchmarks.kv.speed_model import batched, build_model, filled, prefill, tokens
from benchmarks.paths import RESULTS as RESULTS_DIR
from benchmarks.provenance import cpu_name, mlx_version

CONTEXTS = (2048, 8192, 32768)
QUICK_CONTEXTS = (2048, 8192)
ROUNDS = 3
STEPS = 12
BATCH = 4
PREFILL_PROMPT, PREFILL_CHUNK = 1024, 512
RESULTS = RESULTS_DIR / "speed.json"


def decode_step_ms(model: Any, caches: list[Any], token: mx.array) -> float:
    """Milliseconds of one single-token decode step (logits evaluated)."""
    start = time.perf_counter()
    mx.eval(model(token, cache=caches))
    return (time.perf_counter() - start) * 1000


def prefill_ms(model: Any, arm: Arm, prompt: int = PREFILL_PROMPT) -> float:
    """Milliseconds of one 512-token chunk after a `prompt`-token prompt."""
    caches = arm.make_caches(model)
    if prompt:
        prefill(model, caches, tokens(prompt))
    chunk = tokens(PREFILL_CHUNK, seed=3)
    start = time.perf_counter()
    prefill(model, caches, chunk, PREFILL_CHUNK)
    return (time.perf_counter() - start) * 1000


def measure_context(model: Any, arms: list[Arm], context: int) -> dict[str, dict[str, float | None]]:
    """Median decode ms per arm at `context` cached tokens, single and batched (3 interleaved rounds)."""
    single = {a.label: filled(model, a, context) for a in arms}
    batch = {label: batched(caches, BATCH) for label, caches in single.items()}
    times: dict[str, dict[str, list[float]]] = {a.label: {"single": [], "batch": []} for a in arms}
    tokens_of = {"single": tokens(1, 1, seed=2), "batch": tokens(1, BATCH, seed=2)}
    # Interleaved step by step (each arm's step next to every other arm's): on a machine whose
    # load changes by the second, consecutive steps of one arm would measure the load instead.
    for _ in range(ROUNDS):
        for _ in range(STEPS):
            for kind, caches_of in (("single", single), ("batch", batch)):
                for a in arms:
                    caches = caches_of[a.label]
                    if caches is not None:
                        times[a.label][kind].append(decode_step_ms(model, caches, tokens_of[kind]))
    return {
        label: {kind: (statistics.median(t) if t else None) for kind, t in per.items()} for label, per in times.items()
    }


def measure(
    arms: list[Arm], contexts: tuple[int, ...], prefill_rounds: int = ROUNDS, prefill_prompt: int = PREFILL_PROMPT
) -> dict[str, Any]:
    """Prefill (`prefill_rounds` interleaved rounds; 0: none), then decode at each context."""
    model = build_model()
    prefill_times: dict[str, list[float]] = {a.label: [] for a in arms}
    for _ in range(prefill_rounds):
        for a in arms:
            prefill_times[a.label].append(prefill_ms(model, a, prefill_prompt))
    medians = {label: (statistics.median(t) if t else None) for label, t in prefill_times.items()}
    results = header(arms, medians, prefill_rounds, prefill_prompt)
    for context in contexts:
        results["decode_ms"][str(context)] = measure_context(model, arms, context)
        print(render(results), flush=True)  # each context's table as soon as it is measured
    return results


def header(
    arms: list[Arm], prefill: dict[str, float | None], prefill_rounds: int, prefill_prompt: int = PREFILL_PROMPT
) -> dict[str, Any]:
    """A results dict before any decode context is measured."""
    return {
        "machine": cpu_name(),
        "cores": os.cpu_count(),
        "blas_preload": os.environ.get("LD_PRELOAD", ""),
        "mlx": mlx_version(),
        "rounds": ROUNDS,
        "steps": STEPS,
        "arms": [a.to_dict() for a in arms],
        "prefill_ms": prefill,
        "prefill_rounds": prefill_rounds,
        "prefill_prompt": prefill_prompt,
        "decode_ms": {},
    }


def _ratio(reference: float | None, value: float | None) -> str:
    if reference is None or value is None:
        return "n/a"
    return f"{reference / value:.2f}"


def render(results: dict[str, Any]) -> str:
    """The markdown table of a results dict: per arm, prefill and decode ms with speed ratios."""
    contexts = list(results["decode_ms"])
    head = ["cache", "prefill 512 ms", "÷fp16"]
    for c in contexts:
        k = f"{int(c) / 1024:g}k"
        head += [f"{k} ms", f"{k} ÷fp16", f"{k} ÷q4", f"{k}×{BATCH} ms", f"{k}×{BATCH} ÷fp16", f"{k}×{BATCH} ÷q4"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pre = results["prefill_ms"]
    for arm in results["arms"]:
        label = arm["label"]
        row = [label, "n/a" if pre[label] is None else f"{pre[label]:.0f}", _ratio(pre["fp16"], pre[label])]
        for c in contexts:
            d = results["decode_ms"][c]
            for kind in ("single", "batch"):
                ms = d[label][kind]
                row += [
                    "n/a" if ms is None else f"{ms:.1f}",
                    _ratio(d["fp16"][kind], ms),
                    _ratio(d["mlx-q4"][kind], ms),
                ]
        lines.append("| " + " | ".join(row) + " |")
    preload = results["blas_preload"] or "none"
    prefill_rounds = results.get("prefill_rounds", results["rounds"])
    prompt = results.get("prefill_prompt", PREFILL_PROMPT)
    caption = (
        f"{results['machine']}, {results['cores']} cores, MLX {results['mlx']} CPU float32, LD_PRELOAD={preload}; "
        + (f"prefill after {prompt} tokens: median of {prefill_rounds} interleaved rounds; " if prefill_rounds else "")
        + (f"decode: median of {results['steps']} steps x {results['rounds']} interleaved rounds; " if contexts else "")
        + "ratios are speed relative to fp16 / mlx_lm QuantizedKVCache 4-bit (> 1: faster)."
    )
    return "\n".join([*lines, "", caption])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2k and 8k cached tokens only")
    parser.add_argument("--json", action="store_true", help=f"write {RESULTS}")
    parser.add_argument("--out", type=Path, help="write the JSON here instead (a partial run beside the full one)")
    parser.add_argument("--contexts", default="", help="comma-separated cached-token counts (overrides --quick)")
    parser.add_argument("--no-prefill", action="store_true", help="skip the 512-token prefill timing")
    parser.add_argument("--prefill-rounds", type=int, default=ROUNDS, help="interleaved prefill rounds (median)")
    parser.add_argument("--no-decode", action="store_true", help="prefill only (no decode context)")
    parser.add_argument(
        "--prefill-prompt", type=int, default=PREFILL_PROMPT, help="tokens cached before the timed prefill chunk"
    )
    parser.add_argument("--arms", default="", help="comma-separated arm labels (fp16 and mlx-q4 always run)")
    args = parser.parse_args(argv)
    arms = all_arms()
    if args.arms:
        wanted = {"fp16", "mlx-q4", *args.arms.split(",")}
        unknown = wanted - {a.label for a in arms}
        if unknown:
            parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
        arms = [a for a in arms if a.label in wanted]
    preload = os.environ.get("LD_PRELOAD", "")
    print(f"OpenBLAS preloaded: {'yes (' + preload + ')' if 'blas' in preload else 'no'}", flush=True)
    contexts: tuple[int, ...] = QUICK_CONTEXTS if args.quick else CONTEXTS
    if args.contexts:
        contexts = tuple(int(c) for c in args.contexts.split(","))
    if args.no_decode:
        contexts = ()
        if args.no_prefill:
            parser.error("--no-decode with --no-prefill measures nothing")
    rounds = 0 if args.no_prefill else args.prefill_rounds
    results = measure(arms, contexts, prefill_rounds=rounds, prefill_prompt=args.prefill_prompt)
    if not contexts:
        print(render(results), flush=True)
    out = args.out or (RESULTS if args.json else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
