"""Retrieval benchmark: pass-key accuracy per depth through every cache, on the retrieval model.

`python -m benchmarks.kv.retrieval` (`make bench-retrieval`) runs the pass-key trials at 1024 and 4096
tokens, 11 depths, for fp16, mlx_lm's 4-bit cache, every quantizer at its default bits, and every
eviction method and hybrid at 25 % and 50 % of the context. Every arm sees the same prompts. The
question ends the prompt, so eviction policies that look at the last queries (SnapKV's window)
see what will be asked: that is the situation the benchmark measures. Writes
benchmarks/results/retrieval.{json,md}, retrieval_heatmaps.png (whole key retrieved) and
retrieval_token_heatmaps.png (answer tokens right, teacher-forced).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.data import PassKey, TokenizedCorpus, documents, long_held_out, tokenize
from benchmarks.kv import arms as arm_defs
from benchmarks.kv.passkey import answer_token_hits, trials
from benchmarks.kv.quality import Log, make_logger, write
from benchmarks.model import ASSET, load
from benchmarks.paths import RESULTS
from benchmarks.provenance import provenance
from veloxd.kv import registry

MODEL = ASSET.parent / "tiny-llama-retrieval"
CONTEXTS = (1024, 4096)
DEPTHS = tuple(i / 10 for i in range(11))
FRACTIONS = (0.25, 0.5)
KEYS_PER_DEPTH = {1024: 2, 4096: 1}
# Measured on 2 shared cores: a 4k trial costs 2-12 s per arm (quantizers and evicting caches far
# more than fp16), so 28 arms x 11 depths at 4k alone would take ~30 min; 4k takes every other depth.
DEPTHS_AT = {1024: DEPTHS, 4096: DEPTHS[::2]}
FILLER_WINDOWS = 8


def budget_arms(context: int, fractions: tuple[float, ...] = FRACTIONS) -> list[arm_defs.Arm]:
    """Every eviction method and hybrid at each fraction of `context`, labelled `<name>@<pct>%`.

    The label names the fraction, not the token count, so one arm's 1k and 4k rows share a label.
    """
    out = []
    for fraction in fractions:
        budget = int(context * fraction)
        for info in registry.METHODS:
            if info.family not in ("eviction", "hybrid"):
                continue
            policy = info.parts[0] if info.family == "hybrid" else info.name
            settings = arm_defs.eviction_settings(policy, budget)
            bits = info.default_bits if info.family == "hybrid" else None
            name = f"{info.name}-{bits}" if bits else info.name
            label = f"{name}@{round(fraction * 100)}%"
            out.append(arm_defs.Arm(label, info.name, info.family, bits, settings, budget))
    return out


def all_arms(context: int) -> list[arm_defs.Arm]:
    """fp16 (the reference) first, then mlx_lm's q4, the quantizers and the budgeted methods."""
    head = [arm_defs.Arm("fp16", "fp16", "baseline"), arm_defs.Arm("mlx-q4", arm_defs.PEER, "peer", 4)]
    # quantizer_arms' `affine-4` is the unrotated arm; veloxd.yaml's default affine rotates
    return head + arm_defs.quantizer_arms(quick=True) + [arm_defs.rotated_affine_arm(4)] + budget_arms(context)


def scores_by_depth(model: Any, make_caches: Any, cases: list) -> dict[str, Any]:
    """Exact-answer accuracy (greedy decoding gets every token) and answer-token accuracy, per depth."""
    exact: dict[float, list[float]] = {}
    tokens: dict[float, list[float]] = {}
    for depth, prompt, answer in cases:
        hits = answer_token_hits(model, make_caches(), prompt, answer)
        exact.setdefault(depth, []).append(float(all(hits)))
        tokens.setdefault(depth, []).append(float(np.mean(hits)))
    return {
        "by_depth": {f"{d:.1f}": float(np.mean(v)) for d, v in sorted(exact.items())},
        "token_by_depth": {f"{d:.1f}": float(np.mean(v)) for d, v in sorted(tokens.items())},
        "accuracy": float(np.mean([h for v in exact.values() for h in v])),
        "token_accuracy": float(np.mean([h for v in tokens.values() for h in v])),
        "trials": len(cases),
    }


def filler_for(held_out: TokenizedCorpus, context: int) -> list:
    return [w for _, w in long_held_out(held_out, context, FILLER_WINDOWS)]


def run(
    bench_model: Any,
    passkey: PassKey,
    held_out: TokenizedCorpus,
    contexts: tuple[int, ...],
    keys: dict[int, int],
    labels: tuple[str, ...] = (),
    depths: dict[int, tuple[float, ...]] | None = None,
    log: Log | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    done: list[dict] | None = None,
) -> dict[str, Any]:
    """{"rows": [...], "unavailable": {...}}: one row per (arm, context); `labels` restricts the arms;
    `depths` per context (default DEPTHS_AT).

    `progress(result so far)` is called after every row (the CLI writes the JSON each time, so an
    interrupted run keeps what it measured).
    """
    log = log or (lambda *a, **k: None)
    rows: list[dict] = list(done or [])  # rows of an interrupted run, kept and not measured again
    measured_already = {(r["label"], r["context"]) for r in rows}
    unavailable: dict[str, str] = {}
    result = {"rows": rows, "unavailable": unavailable}
    for context in contexts:
        chosen = [a for a in all_arms(context) if not labels or a.label in labels]
        ready, missing = arm_defs.split_available(chosen)
        unavailable.update(missing)
        # Same seed for every arm: all arms answer the same prompts.
        at = (depths or DEPTHS_AT).get(context, DEPTHS)
        cases = trials(passkey, filler_for(held_out, context), context, at, keys[context], seed=context)
        for arm in ready:
            if (arm.label, context) in measured_already:
                continue
            begun = time.time()
            try:
                measured = scores_by_depth(bench_model.model, partial(arm.make_caches, bench_model.model), cases)
            except Exception as error:  # a method under construction must not stop the run
                measured = {"error": f"{type(error).__name__}: {error}"}
            fraction = round(arm.budget / context, 2) if arm.budget else None
            rows.append({**arm.to_dict(), "context": context, "fraction": fraction, **measured})
            log(
                "retrieval_measured",
                arm=arm.label,
                context=context,
                accuracy=measured.get("accuracy"),
                seconds=round(time.time() - begun, 1),
            )
            if progress:
                progress(result)
    return result


def load_inputs(path: Path) -> tuple[Any, PassKey, TokenizedCorpus]:
    """The model (float32), the pass-key pieces from its tokenizer, and the held-out split."""
    bench_model = load(path)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    return bench_model, PassKey(tokenizer), tokenize(tokenizer, documents()["held_out"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--keys", type=int, default=0, help="keys per depth at every context (0 = KEYS_PER_DEPTH)")
    arm_defs.add_arms_option(parser)
    parser.add_argument("--resume", action="store_true", help="keep the rows of an interrupted run's retrieval.json")
    args = parser.parse_args(argv)
    started = time.time()
    log = make_logger(started)
    contexts = tuple(args.contexts)
    keys = {c: args.keys or KEYS_PER_DEPTH.get(c, 1) for c in contexts}
    bench_model, passkey, held_out = load_inputs(args.model)
    labels = arm_defs.chosen(args.arms)
    header: dict[str, Any] = {
        "provenance": provenance(args.model),
        "plan": {"contexts": contexts, "depths": DEPTHS_AT, "keys_per_depth": keys, "fractions": FRACTIONS},
    }
    out = args.out_dir / "retrieval.json"
    done = json.loads(out.read_text())["rows"] if args.resume and out.exists() else None
    if done:
        header["resumed_with_rows"] = len(done)
    report = run(
        bench_model,
        passkey,
        held_out,
        contexts,
        keys,
        labels,
        log=log,
        progress=lambda r: write({**header, **r}, out),
        done=done,
    )
    report.update(header, seconds=round(time.time() - started, 1))
    write(report, out)
    from benchmarks.docs import retrieval_plots, retrieval_report

    retrieval_plots.heatmaps(report, args.out_dir / "retrieval_heatmaps.png")
    retrieval_plots.heatmaps(report, args.out_dir / "retrieval_token_heatmaps.png", metric="token_by_depth")
    (args.out_dir / "retrieval.md").write_text(retrieval_report.markdown(report))
    log("retrieval_benchmark_finished", seconds=report["seconds"], out=str(args.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
