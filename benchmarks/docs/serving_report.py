"""Markdown table for benchmarks/results/serving.json (veloxd serve vs plain mlx_lm.server)."""

from __future__ import annotations

from typing import Any

from benchmarks.provenance import caption


def cell(value: Any, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def serving_section(report: dict[str, Any]) -> str:
    runs = f"median of {report['rounds']} interleaved rounds"
    lines = [
        "## Serving: `veloxd serve` vs plain `mlx_lm.server` (same model)",
        "",
        f"_{caption(report['provenance'], runs)}_",
        "",
        f"Completions of {report['max_tokens']} tokens (greedy) on a short code prompt; cold start is process "
        "start to READY (veloxd) and to the first answered request (both).",
        "",
        "| server | READY s | first answer s | READY ÷ plain first answer | tok/s, 1 client | ÷ plain | "
        "tok/s, 4 clients | ÷ plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in report["summary"].items():
        if not row.get("runs"):
            lines.append(f"| {label} | failed: {'; '.join(row.get('errors', []))[:120]} | | | | | | |")
            continue
        lines.append(
            f"| {label} | {cell(row['ready_s'])} | {cell(row['first_answer_s'])} | "
            f"{cell(row['ready_vs_plain_first_answer'])} | {cell(row['tokens_per_s_1'], 1)} | "
            f"{cell(row['throughput_1_vs_plain'])} | {cell(row['tokens_per_s_4'], 1)} | {cell(row['throughput_4_vs_plain'])} |"
        )
    return "\n".join(lines) + "\n"
