"""Heatmaps of the retrieval benchmark: one panel per arm, depth x context, colour = accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.docs.retrieval_report import context_label
from benchmarks.provenance import caption

COLUMNS = 4


def grids(rows: list[dict[str, Any]], metric: str = "by_depth") -> dict[str, tuple[list[int], list[str], np.ndarray]]:
    """{arm label: (contexts, depth labels, accuracy (contexts, depths))}; NaN where not measured.

    Arms keep their first-seen order (fp16 first); rows with an error stay NaN.
    """
    out: dict[str, tuple[list[int], list[str], np.ndarray]] = {}
    contexts = sorted({r["context"] for r in rows})
    depths = sorted({d for r in rows for d in r.get(metric, {})}, key=float)
    for row in rows:
        label = row["label"]
        if label not in out:
            out[label] = (contexts, depths, np.full((len(contexts), len(depths)), np.nan))
        grid = out[label][2]
        for depth, accuracy in row.get(metric, {}).items():
            grid[contexts.index(row["context"]), depths.index(depth)] = accuracy
    return out


TITLES = {
    "by_depth": "Pass-key accuracy (%, whole key retrieved) by key depth and context, per cache",
    "token_by_depth": "Answer tokens right (%, teacher-forced) by key depth and context, per cache",
}


def heatmaps(report: dict[str, Any], out: Path, metric: str = "by_depth") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = grids(report["rows"], metric)
    rows_n = max(1, -(-len(panels) // COLUMNS))
    fig, axes = plt.subplots(rows_n, COLUMNS, figsize=(4.2 * COLUMNS, 1.9 * rows_n + 0.8), squeeze=False)
    image = None
    for ax, (label, (contexts, depths, grid)) in zip(axes.flat, panels.items()):
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            text = "-" if np.isnan(value) else f"{value * 100:.0f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=6, color="white" if value < 0.6 else "black")
        ax.set_title(label, fontsize=8)
        ax.set_yticks(range(len(contexts)), [context_label(c) for c in contexts], fontsize=7)
        ax.set_xticks(range(len(depths)), depths, fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.subplots_adjust(hspace=0.85, top=0.93, bottom=0.06, left=0.04, right=0.9)
    fig.text(
        0.47, 0.025, "key depth (0.0 = start of the prompt, 1.0 = just before the question)", ha="center", fontsize=8
    )
    keys = report.get("plan", {}).get("keys_per_depth", {})
    runs = "keys per depth: " + ", ".join(f"{c}: {k}" for c, k in keys.items()) if keys else "tiny run"
    fig.suptitle(TITLES[metric], fontsize=10)
    if "provenance" in report:
        fig.text(0.47, 0.005, caption(report["provenance"], runs), ha="center", fontsize=6)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, fraction=0.02, pad=0.01)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
