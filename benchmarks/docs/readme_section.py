"""docs/results.md's measured tables, generated from benchmarks/results/*.json so the two cannot disagree.

`make bench` writes them to benchmarks/results/README_results.md and replaces the regions of
docs/results.md between GENERATED and END markers (the intro and the per-context tables with
their caveats); the page's other sections are written by hand around them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.docs.report import fmt
from benchmarks.kv.pareto import front
from benchmarks.paths import REPO, RESULTS
from benchmarks.provenance import caption

DOCS_RESULTS = REPO / "docs" / "results.md"
GENERATED = "<!-- generated from benchmarks/results/ by benchmarks/docs (make bench, make bench-speed): {name} -->"
END = "<!-- end of generated {name} -->"
CAVEATS = """**CPU-only caveats.** Everything here ran on a shared 2-core x86 CPU with MLX's CPU backend
in float32 (CPU float16 matmuls are far slower); stored bytes count float32 arrays at 2 bytes, as
an fp16 deployment holds them. Stored and resident bytes carry over to Apple silicon: they are
what each cache holds. Quality (KL, top-1, PPL) carries over for the same model up to float16
rounding. Prefill peak and speed ratios do not: on Metal, fp16 attention runs MLX's fused kernel
(which does not hold the full score matrix the CPU path holds), and mlx_lm's quantized attention
and veloxd's packed-cache attention take other kernels, so those ratios are CPU regression guards
and Apple-silicon figures need their own `make bench` on a Mac. The model has 4M parameters and
trained for under an hour; it did not learn retrieval (pass-key 0 % even with the fp16 cache, see
its MODEL_CARD.md), so here eviction is judged by KL and top-1 past the budget window; pass-key
retrieval is judged on tiny-llama-retrieval ("Retrieval through every cache").
Real models have more heads and key outliers that the realistic-keys variant only imitates."""


def main_rows(report: dict[str, Any], variant: str, context: int) -> list[dict[str, Any]]:
    return [r for r in report["rows"] if r["variant"] == variant and r["context"] == context and not r.get("error")]


def main_table(rows: list[dict[str, Any]], outlier_rows: dict[str, dict[str, Any]]) -> str:
    on_front = set(front(rows))
    lines = [
        "| method | family | stored ÷ fp16 | KL mean | KL mean, realistic keys | top-1 | prefill peak ÷ fp16 | "
        "decode peak ÷ fp16 | decode ÷ fp16 (CPU) | Pareto |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["family"] != "baseline", r["family"], r["stored_vs_fp16"] or 0)):
        other = outlier_rows.get(r["label"], {})
        lines.append(
            f"| `{r['label']}` | {r['family']} | {fmt(r.get('stored_vs_fp16'), 3)} | {fmt(r.get('kl_mean'), 4)} | "
            f"{fmt(other.get('kl_mean'), 4)} | {fmt(r.get('top1_agreement'), 3)} | "
            f"{fmt(r.get('prefill_peak_vs_fp16'), 2)} | {fmt(r.get('decode_peak_vs_fp16'), 2)} | "
            f"{fmt(r.get('decode_speed_vs_fp16'), 2)} | "
            f"{'yes' if r['label'] in on_front else ''} |"
        )
    return "\n".join(lines)


def context_block(report: dict[str, Any], variants: list[str], context: int) -> list[str]:
    base, realistic = variants[0], variants[-1]
    rows = main_rows(report, base, context)
    outliers = {r["label"]: r for r in main_rows(report, realistic, context)}
    positions = max((r.get("positions") or 0) for r in rows)
    runs = max((r.get("speed_runs") or 0) for r in rows)
    block = [
        f"## {context}-token prompts",
        "",
        f"_{caption(report['provenance'], f'{positions} teacher-forced positions per method, speeds median of {runs} runs')}_",
        "",
        main_table(rows, outliers),
        "",
    ]
    for v in variants:
        if main_rows(report, v, context):
            block.append(
                f"On the Pareto front ({v}): " + ", ".join(f"`{x}`" for x in front(main_rows(report, v, context))) + "."
            )
    return block + [""]


def peak_table(peaks: list[dict[str, Any]]) -> str:
    """kv_peak.json's rows: one attention call's transient peak per method, over an fp16 layer cache."""
    lines = [
        "**Measured by `make bench`** (`benchmarks/results/kv_peak.json`; the setting above, in the run that "
        "measured the KV tables, whose caption names machine and date), with each method's defaults (the "
        "hybrids over affine codes):",
        "",
        "| method | prefill peak ÷ fp16 | decode peak ÷ fp16 |",
        "|---|---|---|",
    ]
    lines += [f"| `{p['method']}` | {p['prefill_peak_x_fp16']:.2f} | {p['decode_peak_x_fp16']:.3f} |" for p in peaks]
    return "\n".join(lines)


def parts(
    report: dict[str, Any], contexts: tuple[int, ...] = (1024, 4096), peaks: list[dict[str, Any]] | None = None
) -> dict[str, str]:
    """The generated regions: `intro` (what was measured, a Pareto plot), `tables` (per context, then
    caveats) and, given kv_peak.json's rows, `peaks`."""
    variants = sorted({r["variant"] for r in report["rows"]})
    measured = sorted({r["context"] for r in report["rows"]})
    chosen = [c for c in contexts if c in measured] or measured[:1]
    plot = f"../benchmarks/results/pareto_{variants[-1].replace('+', '_')}_{chosen[0]}.png"
    intro = [
        "Measured by `make bench` on the shipped tiny model (`veloxd/assets/tiny-llama`, see its MODEL_CARD.md); "
        "full tables (resident memory, KL p99, PPL, prefill speed, 8k) in `benchmarks/results/RESULTS.md`, every "
        "figure in `benchmarks/results/kv.json`. *KL mean, realistic keys* is the same model with outlier key "
        "channels (function unchanged).",
        "",
        f"![KL vs stored bytes, {variants[-1]}, {chosen[0]} tokens]({plot})",
    ]
    tables: list[str] = []
    for context in chosen:
        tables += context_block(report, variants, context)
    regions = {"intro": "\n".join(intro), "tables": "\n".join(tables + [CAVEATS])}
    return regions | ({"peaks": peak_table(peaks)} if peaks is not None else {})


def render(report: dict[str, Any], contexts: tuple[int, ...] = (1024, 4096)) -> str:
    """README_results.md: the generated regions as one page."""
    regions = parts(report, contexts)
    return "\n".join(["# Results", "", regions["intro"], "", regions["tables"], ""])


def splice(page: str, regions: dict[str, str]) -> str:
    """`page` with each region's text between its markers; ValueError naming a region whose markers are missing."""
    for name, text in regions.items():
        begin, end = GENERATED.format(name=name), END.format(name=name)
        head, found, rest = page.partition(begin)
        _, closed, tail = rest.partition(end)
        if not found or not closed:
            raise ValueError(f"region {name!r}: markers {begin!r} and {end!r} not both found")
        page = f"{head}{begin}\n{text}\n{end}{tail}"
    return page


def main(results: Path = RESULTS, page: Path | None = DOCS_RESULTS) -> int:
    """Write README_results.md; splice `page` too (run_all passes None for quick runs)."""
    report = json.loads((results / "kv.json").read_text())
    out = results / "README_results.md"
    out.write_text(render(report))
    print(out)
    if page is not None:
        peaks = json.loads((results / "kv_peak.json").read_text())
        page.write_text(splice(page.read_text(), parts(report, peaks=peaks)))
        print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
