"""The retrieval benchmark end to end on a tiny run: arms, rows per depth, verdicts, heatmap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.docs.retrieval_plots import grids
from benchmarks.docs.retrieval_report import by_label, keeps_retrieval, markdown, verdicts
from benchmarks.kv import arms as arm_defs
from benchmarks.kv.retrieval import budget_arms
from veloxd.kv import registry

MODEL = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama-retrieval"
CONTEXT = 256
LABELS = ("fp16", "streaming_llm@25%", "snapkv@50%")


@pytest.fixture(scope="module")
def tiny_report() -> dict[str, Any]:
    from benchmarks.kv.retrieval import load_inputs, run

    bench_model, passkey, held_out = load_inputs(MODEL)
    return run(bench_model, passkey, held_out, (CONTEXT,), {CONTEXT: 2}, LABELS, {CONTEXT: (0.0, 1.0)})


def test_budget_arms_cover_every_eviction_method_and_hybrid_at_both_fractions() -> None:
    arms = budget_arms(4096)
    budgeted = [m.name for m in registry.METHODS if m.family in ("eviction", "hybrid")]
    assert sorted(a.method for a in arms) == sorted(budgeted * 2)
    assert {a.budget for a in arms} == {1024, 2048}
    snap = next(a for a in arms if a.label == "snapkv@25%")
    assert snap.settings == arm_defs.eviction_settings("snapkv", 1024)
    hybrid = next(a for a in arms if a.label.startswith("h2o_affine") and a.budget == 2048)
    assert hybrid.bits == registry.get("h2o_affine").default_bits and hybrid.config() is not None


def test_tiny_run_has_one_row_per_arm_with_accuracy_per_depth(tiny_report: dict[str, Any]) -> None:
    rows = tiny_report["rows"]
    assert [r["label"] for r in rows] == list(LABELS)
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["context"] == CONTEXT and row["trials"] == 4
        assert list(row["by_depth"]) == ["0.0", "1.0"]
        assert all(a in (0.0, 0.5, 1.0) for a in row["by_depth"].values())
        assert list(row["token_by_depth"]) == ["0.0", "1.0"]
        # the whole key is right only if every one of its tokens is
        assert all(row["token_by_depth"][d] >= row["by_depth"][d] for d in ("0.0", "1.0"))
        assert 0.0 <= row["token_accuracy"] <= 1.0
    assert rows[1]["budget"] == 64 and rows[1]["fraction"] == 0.25
    assert rows[2]["budget"] == 128 and rows[2]["fraction"] == 0.5


def test_heatmap_grid_and_figure_and_table(tiny_report: dict[str, Any], tmp_path: Path) -> None:
    from benchmarks.docs.retrieval_plots import heatmaps

    panels = grids(tiny_report["rows"])
    assert list(panels) == list(LABELS)
    contexts, depths, grid = panels["fp16"]
    assert contexts == [CONTEXT] and depths == ["0.0", "1.0"] and grid.shape == (1, 2)
    assert np.allclose(grid[0], list(tiny_report["rows"][0]["by_depth"].values()))
    for metric in ("by_depth", "token_by_depth"):
        out = heatmaps(tiny_report, tmp_path / f"{metric}.png", metric)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = markdown(tiny_report)
    assert "| snapkv@50% | eviction | 50 % (128 tokens) |" in table
    assert "| accuracy at 256 | answer tokens at 256 |" in table
    assert "- **streaming_llm**: keeps retrieval at 25 %: " in table


def test_keeps_retrieval_needs_every_cell_fp16_retrieves() -> None:
    fp16 = {1024: {"by_depth": {"0.0": 1.0, "1.0": 1.0}}, 4096: {"by_depth": {"0.0": 1.0, "1.0": 0.5}}}
    good = {1024: {"by_depth": {"0.0": 1.0, "1.0": 0.95}}, 4096: {"by_depth": {"0.0": 1.0, "1.0": 0.5}}}
    bad = {1024: good[1024], 4096: {"by_depth": {"0.0": 0.9, "1.0": 1.0}}}
    fp16_missed = {1024: good[1024], 4096: {"by_depth": {"0.0": 1.0, "1.0": 0.4}}}
    failed: dict[int, dict[str, Any]] = {1024: {**good[1024], "error": "ValueError: x"}, 4096: good[4096]}
    assert keeps_retrieval(good, fp16)
    assert not keeps_retrieval(bad, fp16)  # 0.9 where fp16 has every key
    assert not keeps_retrieval(fp16_missed, fp16)  # below even fp16's share at 1.0 @ 4k
    assert keeps_retrieval(fp16_missed, {1024: fp16[1024], 4096: {"by_depth": {"0.0": 1.0, "1.0": 0.0}}})
    assert not keeps_retrieval(failed, fp16)
    assert not keeps_retrieval({1024: good[1024]}, fp16)  # 4k not measured
    assert not keeps_retrieval({}, fp16)


def test_verdicts_need_a_retrieving_fp16_reference() -> None:
    def row(label: str, family: str, accuracy: float) -> dict:
        return {
            "label": label,
            "family": family,
            "context": 1024,
            "fraction": 0.25,
            "accuracy": accuracy,
            "by_depth": {"0.0": accuracy},
        }

    evicting = row("snapkv@25%", "eviction", 1.0)
    assert verdicts(by_label([row("fp16", "baseline", 1.0), evicting])) == [
        "- **snapkv**: keeps retrieval at 25 %: yes"
    ]
    assert verdicts(by_label([row("fp16", "baseline", 1.0), row("snapkv@25%", "eviction", 0.0)])) == [
        "- **snapkv**: keeps retrieval at 25 %: no"
    ]
    assert verdicts(by_label([row("fp16", "baseline", 0.7), evicting])) == [
        "- **snapkv**: keeps retrieval at 25 %: n/a (fp16 does not retrieve)"
    ]
