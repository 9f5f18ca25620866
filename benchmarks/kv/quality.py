"""KV-cache benchmark: quality, memory and speed of every method vs the fp16 cache and mlx_lm's.

`python -m benchmarks.kv.quality [--quick]` writes benchmarks/results/kv.json (every figure, with
provenance); `benchmarks.docs.report` and `benchmarks.docs.plots` render it. Documents are the outer loop
and arms the inner one, so speed samples of different arms interleave in time.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmarks.data import PassKey, documents, long_held_out, tokenize
from benchmarks.kv import arms as arm_defs
from benchmarks.kv.measure import run_document
from benchmarks.kv.passkey import DEPTHS, accuracy_by_depth, trials
from benchmarks.kv.summary import Samples, memory, quality, ratios, speed
from benchmarks.model import BenchModel, key_channel_stats, load, max_logit_difference, model_path, with_outlier_keys
from benchmarks.paths import RESULTS
from benchmarks.provenance import provenance

PASSKEY_RESERVE_S = 120.0  # kept back for the pass-key trials when planning long contexts
MIN_REFERENCE_PASSKEY = 0.5  # below this fp16 accuracy, methods are not pass-key tested


class Log(Protocol):
    """What make_logger returns: prints one JSON event line with `fields`."""

    def __call__(self, event: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class Plan:
    contexts: tuple[int, ...]
    docs: dict[int, int]  # held-out documents per context
    decode: dict[int, int]  # teacher-forced single-token steps per document
    subsets: dict[int, tuple[str, ...]]  # contexts that run only these arm labels
    passkey_length: int
    passkey_depths: tuple[float, ...]
    passkey_keys: int  # trials per depth
    optional_context: int | None = None  # measured (base variant only) if the budget allows
    budget_minutes: float = 40.0
    shares: dict[int, float] = field(default_factory=dict)  # budget fraction per context (document cut-off)

    @classmethod
    def full(cls) -> Plan:
        at_4k: tuple[str, ...] = (
            "fp16",
            "mlx-q2",
            "mlx-q4",
            "mlx-q8",
            "affine-2",
            "affine-4",
            "affine-rot-4",
            "affine-k8v4",
            "kivi-2",
            "kivi-4",
            "turboquant_mse-3",
            "turboquant_mse-4",
            "turboquant_mse-3-k4",
            "turboquant_mse-3-k4-w16",
            "turboquant_mse-3-k4-w0",
            "turboquant_mse-4-w16",  # the settings docs/caches.md gives for mlx_lm's footprints
            "turboquant_mse-2-k4-w16",
            "affine-rot-4-w0",
            "turboquant_prod-3",
            "qjl-4",
        )
        at_4k += tuple(f"{m}-{b}" for m in ("streaming_llm", "knorm", "snapkv", "tova", "h2o") for b in (512, 1024))
        at_4k += ("snapkv_affine-4-512", "snapkv_affine-rot-4-512", "h2o_affine-4-512")
        at_8k = (
            "fp16",
            "mlx-q4",
            "mlx-q8",
            "affine-4",
            "kivi-4",
            "turboquant_mse-3",
            "streaming_llm-512",
            "snapkv-512",
        )
        return cls(
            (1024, 4096),
            {1024: 4, 4096: 3, 8192: 1},
            {1024: 48, 4096: 32, 8192: 16},
            {4096: at_4k, 8192: at_8k},
            1024,
            DEPTHS,
            2,
            optional_context=8192,
            budget_minutes=40.0,
            shares={1024: 0.25, 4096: 0.7},
        )

    @classmethod
    def quick(cls) -> Plan:
        return cls((1024,), {1024: 1}, {1024: 32}, {}, 1024, (0.1, 0.5, 0.9), 2, budget_minutes=4.0)

    @classmethod
    def custom(cls, contexts: list[int], docs: int, decode: int, labels: tuple[str, ...], passkey: bool) -> Plan:
        """A small explicit plan (tests, spot checks): `labels` restricts the arms at every context."""
        return cls(
            tuple(contexts),
            {c: docs for c in contexts},
            {c: decode for c in contexts},
            {c: labels for c in contexts} if labels else {},
            min(contexts),
            (0.1, 0.9) if passkey else (),
            1,
        )


def arms_for(context: int, plan: Plan, quick: bool) -> list[arm_defs.Arm]:
    arms = arm_defs.all_arms(context, quick)
    subset = plan.subsets.get(context)
    return [a for a in arms if a.label in subset] if subset else arms


def measure_context(
    variants: list[BenchModel],
    arms: list[arm_defs.Arm],
    windows: list[np.ndarray],
    prompt_len: int,
    log: Log,
    deadline: float = float("inf"),
) -> dict[str, dict[str, Samples]]:
    """{variant: {arm label: Samples}}; fp16 must be the first arm (it is the reference).

    Stops early (keeping at least one document) when the next document would end past `deadline`.
    """
    results: dict[str, dict[str, Samples]] = {v.name: {a.label: Samples() for a in arms} for v in variants}
    begun = time.time()
    for doc_index, tokens in enumerate(windows):
        per_doc = (time.time() - begun) / max(1, doc_index)
        if doc_index and time.time() + per_doc > deadline:
            log("context_cut_short", context=prompt_len, docs_done=doc_index, docs_planned=len(windows))
            break
        for variant in variants:
            reference = None
            for arm in arms:
                samples = results[variant.name][arm.label]
                if samples.error:
                    continue
                try:
                    run = run_document(variant.model, partial(arm.make_caches, variant.model), tokens, prompt_len)
                except Exception as error:  # a method under construction must not stop the run
                    samples.error = f"{type(error).__name__}: {error}"
                    log("arm_failed", arm=arm.label, variant=variant.name, error=samples.error)
                    continue
                if arm.label == "fp16":
                    reference = run
                # fp16 is compared with itself (KL 0, top-1 1) so its row reads like the others.
                samples.add(run, reference)
            log("document_measured", context=prompt_len, doc=doc_index, variant=variant.name)
    return results


def rows_for(results: dict[str, dict[str, Samples]], arms: list[arm_defs.Arm], context: int) -> list[dict]:
    rows = []
    # Both variants compute the same function with the same shapes: their speed runs are pooled.
    pooled = {
        a.label: speed(Samples(runs=[r for by_arm in results.values() for r in by_arm[a.label].runs])) for a in arms
    }
    for variant, by_arm in results.items():
        summaries = {}
        for arm in arms:
            s = by_arm[arm.label]
            summaries[arm.label] = {**quality(s), **memory(s), **pooled[arm.label]}
        reference = summaries.get("fp16", {})
        for arm in arms:
            s = by_arm[arm.label]
            row = {"variant": variant, "context": context, **arm.to_dict(), **summaries[arm.label]}
            row.update(ratios(summaries[arm.label], reference, is_reference=arm.label == "fp16"))
            if s.error:
                row["error"] = s.error
            rows.append(row)
    return rows


def passkey_rows(
    variants: list[BenchModel],
    arms: list[arm_defs.Arm],
    plan: Plan,
    filler: list[np.ndarray],
    passkey: PassKey,
    log: Log,
) -> list[dict[str, Any]]:
    length = plan.passkey_length
    cases = trials(passkey, filler, length, plan.passkey_depths, plan.passkey_keys)
    chosen = [a for a in arms if a.label == "fp16" or a.family in ("eviction", "hybrid") or a.bits == 2]
    rows: list[dict[str, Any]] = []
    for variant in variants:
        for arm in chosen:
            reference = next((r for r in rows if r["label"] == "fp16" and r["variant"] == variant.name), None)
            if reference and reference.get("accuracy", 0) < MIN_REFERENCE_PASSKEY:
                # The fp16 cache itself does not retrieve: method figures would measure nothing.
                log("passkey_skipped", arm=arm.label, variant=variant.name, fp16_accuracy=reference.get("accuracy"))
                continue
            try:
                result = accuracy_by_depth(variant.model, partial(arm.make_caches, variant.model), cases)
            except Exception as error:
                result = {"error": f"{type(error).__name__}: {error}"}
            rows.append({"variant": variant.name, "context": length, **arm.to_dict(), **result})
            log("passkey_measured", arm=arm.label, variant=variant.name, accuracy=result.get("accuracy"))
    return rows


def estimated_cost(cost: dict[int, float], context: int) -> float | None:
    """Seconds per (document x variant x arm) at `context`, scaled from the longest measured one.

    Attention grows quadratically but the rest linearly; exponent 1.5 sits between, and is a plan,
    not a figure: the measured figures are what the report shows.
    """
    if not cost:
        return None
    measured = max(cost)
    return cost[measured] * (context / measured) ** 1.5


def make_logger(started: float) -> Log:
    def log(event: str, **fields: Any) -> None:
        print(json.dumps({"event": event, "t": round(time.time() - started, 1), **fields}), flush=True)

    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one context length, fewer arms (< 5 min)")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped tiny model)")
    parser.add_argument("--out", type=Path, default=RESULTS / "kv.json")
    parser.add_argument("--contexts", type=int, nargs="+", help="custom plan: prompt lengths")
    parser.add_argument("--docs", type=int, default=1, help="custom plan: documents per context")
    parser.add_argument("--decode", type=int, default=16, help="custom plan: teacher-forced steps per document")
    arm_defs.add_arms_option(parser, "custom plan: ")
    parser.add_argument("--no-passkey", action="store_true", help="custom plan: skip pass-key trials")
    args = parser.parse_args(argv)
    started = time.time()
    log = make_logger(started)
    if args.contexts:
        labels = arm_defs.chosen(args.arms)
        plan = Plan.custom(args.contexts, args.docs, args.decode, labels, not args.no_passkey)
    else:
        plan = Plan.quick() if args.quick else Plan.full()

    path = model_path(args.model)
    base = load(path)
    variant = with_outlier_keys(base)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    held_out = tokenize(tokenizer, documents()["held_out"])
    import mlx.core as mx

    probe = mx.array(held_out.docs[0][:512])[None]  # (1, 512)
    variant_check = {
        "max_abs_logit_diff": max_logit_difference(base.model, variant.model, probe),
        "key_max_over_median": {
            base.name: key_channel_stats(base.model, probe)["max_over_median"],
            variant.name: key_channel_stats(variant.model, probe)["max_over_median"],
        },
    }
    log("variant_checked", **variant_check)
    variants = [base, variant]

    report: dict[str, Any] = {
        "provenance": provenance(path),
        "plan": plan.__dict__,
        "variant_check": variant_check,
        "rows": [],
        "unavailable": {},
        "passkey": [],
    }
    cost: dict[int, float] = {}  # seconds per (document x variant x arm) at each context

    def run_context(context: int, chosen_variants: list[BenchModel]) -> None:
        arms, unavailable = arm_defs.split_available(arms_for(context, plan, args.quick))
        report["unavailable"].update(unavailable)
        E = plan.decode[context]
        # Every planned document; measure_context stops at the context's share of the budget, judged
        # by the documents it has measured (an estimate scaled from a shorter context cut 4k to 1 of
        # 3 documents in a run that then left 18 of its 40 minutes unused).
        windows = [w for _, w in long_held_out(held_out, context + E, plan.docs[context])]
        log(
            "context_started",
            context=context,
            arms=len(arms),
            docs=len(windows),
            planned_docs=plan.docs[context],
            unavailable=sorted(unavailable),
        )
        begun = time.time()
        share = plan.shares.get(context, 1.0)
        deadline = begun + share * (plan.budget_minutes * 60 - PASSKEY_RESERVE_S)
        results = measure_context(chosen_variants, arms, windows, context, log, deadline)
        done = len(results[chosen_variants[0].name]["fp16"].runs)  # documents measured before the cut-off
        cost[context] = (time.time() - begun) / max(1, done * len(chosen_variants) * len(arms))
        report["rows"] += rows_for(results, arms, context)
        write(report, args.out)

    for context in plan.contexts:
        run_context(context, variants)
    if plan.passkey_depths:
        arms, _ = arm_defs.split_available(arms_for(plan.passkey_length, plan, args.quick))
        filler = [w for _, w in long_held_out(held_out, plan.passkey_length, 8)]
        report["passkey"] = passkey_rows(variants, arms, plan, filler, PassKey(tokenizer), log)
        write(report, args.out)
    extra = plan.optional_context
    if extra and cost:
        per_run = estimated_cost(cost, extra)
        assert per_run is not None  # only None without measured contexts, and `cost` has some
        estimate = per_run * len(plan.subsets.get(extra, ())) * plan.docs[extra]
        remaining = plan.budget_minutes * 60 - (time.time() - started)
        log("optional_context_planned", context=extra, estimate_s=round(estimate), remaining_s=round(remaining))
        if estimate < remaining:
            run_context(extra, variants[:1])
        else:
            report["skipped_contexts"] = {str(extra): f"estimated {estimate:.0f}s, {remaining:.0f}s of budget left"}
    report["seconds"] = round(time.time() - started, 1)
    write(report, args.out)
    log("kv_benchmark_finished", seconds=report["seconds"], out=str(args.out))
    return 0


def write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=float) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
