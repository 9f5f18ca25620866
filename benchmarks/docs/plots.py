"""Pareto plots (KL vs stored bytes per token) from benchmarks/results/kv.json, one PNG per variant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.kv.pareto import front
from benchmarks.paths import RESULTS
from benchmarks.provenance import caption

KL_FLOOR = 1e-6  # log axis: a KL of exactly 0 (fp16 against itself) is drawn at the floor
STYLE = {
    "baseline": ("black", "*"),
    "peer": ("tab:red", "s"),
    "quantization": ("tab:blue", "o"),
    "eviction": ("tab:green", "^"),
    "hybrid": ("tab:purple", "D"),  # eviction over a quantized store
}


def draw(ax: Any, rows: list[dict[str, Any]]) -> list[str]:
    """Scatter `rows` on `ax` by family (one colour, marker and legend entry each), labels bold on
    the Pareto front, the front as a dashed step line; returns the front's labels. Rows lacking
    either figure are left out."""
    rows = [r for r in rows if r.get("stored_vs_fp16") is not None and r.get("kl_mean") is not None]
    unstyled = {r["family"] for r in rows} - set(STYLE)
    if unstyled:  # a family without a style would be annotated but never scattered nor in the legend
        raise ValueError(f"no plot style for famil{'ies' if len(unstyled) > 1 else 'y'} {sorted(unstyled)}")
    on_front = front(rows)
    for family, (color, marker) in STYLE.items():
        mine = [r for r in rows if r["family"] == family]
        if mine:
            ax.scatter(
                [r["stored_vs_fp16"] for r in mine],
                [max(r["kl_mean"], KL_FLOOR) for r in mine],
                c=color,
                marker=marker,
                s=60,
                label=family if family != "peer" else "mlx_lm QuantizedKVCache",
            )
    for r in rows:
        weight = "bold" if r["label"] in on_front else "normal"
        ax.annotate(
            r["label"],
            (r["stored_vs_fp16"], max(r["kl_mean"], KL_FLOOR)),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
            fontweight=weight,
        )
    ordered = sorted((r for r in rows if r["label"] in on_front), key=lambda r: r["stored_vs_fp16"])
    ax.step(
        [r["stored_vs_fp16"] for r in ordered],
        [max(r["kl_mean"], KL_FLOOR) for r in ordered],
        where="post",
        color="gray",
        linestyle="--",
        linewidth=1,
        label="Pareto front",
    )
    return on_front


def pareto_plot(rows: list[dict[str, Any]], title: str, note: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    draw(ax, rows)
    ax.set_yscale("log")
    ax.set_xlabel("stored bytes per token / fp16 cache")
    ax.set_ylabel("mean KL(fp16 || method) of next-token distributions (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.text(0.01, 0.01, note, fontsize=6.5, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def render(report: dict[str, Any], out_dir: Path = RESULTS) -> list[Path]:
    written = []
    prov = report["provenance"]
    for variant in sorted({r["variant"] for r in report["rows"]}):
        for context in sorted({r["context"] for r in report["rows"] if r["variant"] == variant}):
            rows = [
                r for r in report["rows"] if r["variant"] == variant and r["context"] == context and not r.get("error")
            ]
            if len(rows) < 2:
                continue
            positions = max((r.get("positions") or 0) for r in rows)
            note = caption(prov, f"{positions} teacher-forced positions per method")
            name = f"pareto_{variant.replace('+', '_')}_{context}.png"
            title = f"KV-cache quality vs memory, {variant}, {context}-token prompts"
            written.append(pareto_plot(rows, title, note, out_dir / name))
    return written


def main(results: Path = RESULTS) -> int:
    report = json.loads((results / "kv.json").read_text())
    for path in render(report, results):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
