"""Markdown tables from benchmarks/results/*.json: per-context method tables, pass-key, targets, serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.kv.pareto import front
from benchmarks.paths import RESULTS
from benchmarks.provenance import caption

COLUMNS = [
    ("method", lambda r: f"`{r['label']}`"),
    ("stored B/tok ÷ fp16", lambda r: fmt(r.get("stored_vs_fp16"), 3)),
    ("resident ÷ fp16", lambda r: fmt(r.get("resident_vs_fp16"), 3)),
    ("resident ÷ nbytes", lambda r: fmt(r.get("resident_over_nbytes"), 2)),
    ("prefill peak ÷ fp16", lambda r: fmt(r.get("prefill_peak_vs_fp16"), 2)),
    ("decode peak ÷ fp16", lambda r: fmt(r.get("decode_peak_vs_fp16"), 2)),
    ("KL mean [95 % CI]", lambda r: kl_cell(r)),
    ("KL p99", lambda r: fmt(r.get("kl_p99"), 4)),
    ("top-1 agree", lambda r: fmt(r.get("top1_agreement"), 3)),
    ("PPL ÷ fp16", lambda r: fmt(r.get("ppl_ratio"), 3)),
    ("older-only token acc (n)", lambda r: f"{fmt(r.get('far_accuracy'), 2)} ({r.get('far_positions', 0)})"),
    ("prefill tok/s ÷ fp16", lambda r: fmt(r.get("prefill_speed_vs_fp16"), 2)),
    ("decode tok/s ÷ fp16", lambda r: fmt(r.get("decode_speed_vs_fp16"), 2)),
]


def fmt(value: Any, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def kl_cell(r: dict[str, Any]) -> str:
    if r.get("kl_mean") is None:
        return "–"
    low, high = r.get("kl_mean_ci95") or (None, None)
    return f"{r['kl_mean']:.4f} [{low:.4f}, {high:.4f}]" if low is not None else f"{r['kl_mean']:.4f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| `{r['label']}` | failed: {r['error'][:120]} |" + " |" * (len(COLUMNS) - 2))
        else:
            lines.append("| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |")
    return "\n".join(lines)


def fp16_absolute(rows: list[dict[str, Any]]) -> str:
    ref = next((r for r in rows if r["label"] == "fp16" and not r.get("error")), None)
    if ref is None:
        return ""
    return (
        f"fp16 reference: {ref['stored_bytes_per_token']:.0f} stored B/token (all layers), prefill "
        f"{ref['prefill_tokens_per_s']:.0f} tok/s, decode {ref['decode_tokens_per_s']:.1f} tok/s "
        f"(median of {ref['speed_runs']} interleaved runs), prefill peak {ref['prefill_peak_bytes'] / 2**20:.1f} MiB."
    )


def passkey_table(rows: list[dict[str, Any]]) -> str:
    depths = next((list(r["by_depth"]) for r in rows if "by_depth" in r), [])
    head = "| variant | method | " + " | ".join(f"depth {d}" for d in depths) + " | overall |"
    lines = [head, "|" + "---|" * (len(depths) + 3)]
    for r in rows:
        if "by_depth" not in r:
            lines.append(f"| {r['variant']} | `{r['label']}` | failed: {r.get('error', '')[:100]} |")
            continue
        cells = " | ".join(f"{v:.0%}" for v in r["by_depth"].values())
        lines.append(f"| {r['variant']} | `{r['label']}` | {cells} | {r['accuracy']:.0%} ({r['trials']}) |")
    return "\n".join(lines)


LEGEND = """Columns: *stored B/tok* = bytes of the cache state per token seen, float32 arrays counted at 2 bytes
(the run is float32 for CPU speed; deployments hold fp16), over the fp16 cache. *resident* = MLX active
memory held by the caches after decode (eval, gc, clear_cache; raw float32 run) over an fp16 cache's
(the float32 KVCache's halved); *resident ÷ nbytes* near 1 means no hidden fp16 copy. *prefill peak* =
peak memory above the pre-cache baseline during chunked prefill (2048-token chunks). KL, top-1 and PPL
are teacher-forced through the cache after the prompt, vs the fp16 cache on the same tokens; CI by
bootstrap over positions. *older-only token acc* = next-token accuracy at positions whose target occurs in
the prompt but not in its last quarter (a copy only an intact older cache allows; n positions). Speeds are
medians over documents x both variants (same compute), arms interleaved per document."""


def kv_section(report: dict[str, Any]) -> str:
    prov = report["provenance"]
    out = ["# KV-cache benchmark", "", f"_{caption(prov, 'see per-table run counts')}_", "", LEGEND, ""]
    check = report.get("variant_check", {})
    if check:
        ratios = check["key_max_over_median"]
        out.append(
            f"Realistic-keys variant: max |logit diff| {check['max_abs_logit_diff']:.1e}; key channel "
            f"RMS max/median {' -> '.join(f'{v:.1f}' for v in ratios.values())}."
        )
        out.append("")
    for variant in sorted({r["variant"] for r in report["rows"]}):
        for context in sorted({r["context"] for r in report["rows"]}):
            rows = [r for r in report["rows"] if r["variant"] == variant and r["context"] == context]
            if not rows:
                continue
            positions = max((r.get("positions") or 0) for r in rows)
            out += [
                f"## {variant}, {context}-token prompts",
                "",
                f"{positions} teacher-forced positions per method; " + fp16_absolute(rows),
                "",
                table(rows),
                "",
                "Pareto front (stored bytes vs KL): " + ", ".join(f"`{x}`" for x in front(rows)),
                "",
            ]
    if report.get("passkey"):
        out += ["## Pass-key retrieval by depth", "", passkey_table(report["passkey"]), ""]
        if all(p["label"] == "fp16" for p in report["passkey"]):
            out += [
                "The fp16 cache itself did not retrieve the key, so the methods were not pass-key tested; "
                "the `older-only token acc` column (next-token accuracy where the target occurs in the prompt but "
                "not in its last quarter) is the long-range probe instead.",
                "",
            ]
    for context, why in report.get("skipped_contexts", {}).items():
        out += [f"{context}-token prompts were skipped: {why} (time budget of `make bench`).", ""]
    if report.get("unavailable"):
        out += ["## Not measured", ""] + [f"- `{k}`: {v}" for k, v in sorted(report["unavailable"].items())] + [""]
    return "\n".join(out)


def main(results: Path = RESULTS) -> int:
    report = json.loads((results / "kv.json").read_text())
    text = kv_section(report)
    serving = results / "serving.json"
    if serving.exists():
        from benchmarks.docs.serving_report import serving_section

        text += "\n" + serving_section(json.loads(serving.read_text()))
    from benchmarks.kv.targets import targets_section

    text += "\n" + targets_section(report, json.loads(serving.read_text()) if serving.exists() else None)
    (results / "RESULTS.md").write_text(text)
    print(results / "RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
