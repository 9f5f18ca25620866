"""Hybrid rows (eviction over a quantized store) on the Pareto plots and in the report tables:
their own colour, marker and legend entry, counted for the front, drawn from a kv.json report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.docs import plots, report
from benchmarks.kv import arms
from tests.support import REPO

HYBRID = "snapkv_affine-4-512"


def row(label: str, family: str, stored: float, kl: float) -> dict[str, Any]:
    return {"variant": "tiny-llama", "context": 4096, "label": label, "family": family,
            "stored_vs_fp16": stored, "kl_mean": kl}  # fmt: skip


# The hybrid holds the eviction arm's tokens as 4-bit codes: smaller and, here, better than the
# plain eviction arm (which it dominates), on the front between it and the 4-bit quantizer.
ROWS = [
    row("fp16", "baseline", 1.0, 0.0),
    row("mlx-q4", "peer", 0.30, 0.012),
    row("affine-4", "quantization", 0.28, 0.010),
    row("snapkv-512", "eviction", 0.125, 0.5),
    row(HYBRID, "hybrid", 0.04, 0.02),
    row("h2o_affine-4-512", "hybrid", 0.05, 0.9),  # dominated by the first hybrid
]


@pytest.fixture
def ax() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots()
    yield axes
    plt.close(fig)


def test_hybrids_are_scattered_in_their_own_style_with_a_legend_entry(ax: Any) -> None:
    from matplotlib.colors import to_rgba

    plots.draw(ax, ROWS)
    handles, labels = ax.get_legend_handles_labels()
    assert labels == ["baseline", "mlx_lm QuantizedKVCache", "quantization", "eviction", "hybrid", "Pareto front"]
    hybrid = handles[labels.index("hybrid")]
    assert hybrid.get_offsets().tolist() == [[0.04, 0.02], [0.05, 0.9]]
    assert tuple(hybrid.get_facecolor()[0]) == to_rgba(plots.STYLE["hybrid"][0])
    styles = list(plots.STYLE.values())
    assert len({c for c, _ in styles}) == len({m for _, m in styles}) == len(styles)  # no family looks like another


def test_a_dominating_hybrid_is_on_the_front_and_a_dominated_one_is_not(ax: Any) -> None:
    on_front = plots.draw(ax, ROWS)
    assert on_front == [HYBRID, "affine-4", "fp16"]
    (step,) = [line for line in ax.get_lines() if line.get_label() == "Pareto front"]
    assert list(step.get_xdata()) == [0.04, 0.28, 1.0]
    weight = {text.get_text(): text.get_fontweight() for text in ax.texts}
    assert weight[HYBRID] == "bold" and weight["h2o_affine-4-512"] == "normal" and weight["snapkv-512"] == "normal"


def test_every_family_an_arm_has_gets_a_style_and_an_unstyled_one_is_refused(ax: Any) -> None:
    families = {a.family for context in (1024, 4096) for a in arms.all_arms(context)}
    assert "hybrid" in families and families <= set(plots.STYLE)
    with pytest.raises(ValueError, match="no plot style for family"):
        plots.draw(ax, [*ROWS, row("other", "mystery", 0.5, 0.1)])


def test_the_measured_report_with_a_hybrid_row_renders_and_tabulates_it(tmp_path: Path) -> None:
    result = json.loads((REPO / "benchmarks" / "results" / "kv.json").read_text())
    evicting = next(r for r in result["rows"] if r["family"] == "eviction" and r["context"] == 4096)
    hybrid = copy.deepcopy(evicting) | {"label": HYBRID, "method": "snapkv_affine", "family": "hybrid", "bits": 4}
    hybrid |= {"stored_vs_fp16": 0.001, "kl_mean": 0.0005}  # dominates every compressed arm there
    result["rows"].append(hybrid)
    pngs = plots.render(result, tmp_path)
    assert tmp_path / "pareto_tiny-llama_4096.png" in pngs and all(p.stat().st_size > 10_000 for p in pngs)
    text = report.kv_section(result)
    section = text[text.index("## tiny-llama, 4096-token prompts") :]
    section = section[: section.index("\n## ")]
    assert f"| `{HYBRID}` |" in section
    front_line = next(line for line in section.splitlines() if line.startswith("Pareto front"))
    assert front_line.startswith(f"Pareto front (stored bytes vs KL): `{HYBRID}`"), front_line
