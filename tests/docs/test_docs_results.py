"""docs/results.md's measured tables are benchmarks/results/'s figures, as `make bench` splices them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.docs import readme_section


def test_the_results_page_holds_exactly_the_tables_the_results_give() -> None:
    report = json.loads((readme_section.RESULTS / "kv.json").read_text())
    peaks = json.loads((readme_section.RESULTS / "kv_peak.json").read_text())
    page = readme_section.DOCS_RESULTS.read_text()
    assert readme_section.splice(page, readme_section.parts(report, peaks=peaks)) == page
    assert "| `mlx-q4` | peer |" in page and "| `snapkv_affine` |" in page


def test_splicing_replaces_only_between_the_markers() -> None:
    begin, end = readme_section.GENERATED.format(name="tables"), readme_section.END.format(name="tables")
    page = f"# Results\n\nby hand\n{begin}\nold table\n{end}\n\nalso by hand\n"
    spliced = readme_section.splice(page, {"tables": "new table"})
    assert spliced == f"# Results\n\nby hand\n{begin}\nnew table\n{end}\n\nalso by hand\n"


def test_a_page_without_a_regions_markers_is_refused_by_region_name() -> None:
    with pytest.raises(ValueError, match="region 'intro'"):
        readme_section.splice("# Results\n", {"intro": "text"})


def test_the_results_page_holds_the_speed_summary_the_speed_results_give() -> None:
    from benchmarks.docs import speed_section

    page = readme_section.DOCS_RESULTS.read_text()
    text = speed_section.render(*speed_section.load())
    assert readme_section.splice(page, {speed_section.REGION: text}) == page
    assert "| kivi-4 |" in text and "| h2o_affine-4 |" in text and "| turboquant_mse |" in text


def _speed_results() -> tuple[dict, dict, dict]:
    """Results of a two-context run: fp16 10/40 ms, mlx-q4 20/80, one method 5/50; prefill 400/800 ms."""
    per = {
        "8192": {"fp16": 10.0, "mlx-q4": 20.0, "affine-4": 5.0},
        "32768": {"fp16": 40.0, "mlx-q4": 80.0, "affine-4": 50.0},
    }
    decode = {c: {arm: {"single": ms, "batch": 2 * ms} for arm, ms in arms.items()} for c, arms in per.items()}
    arms = [{"label": label} for label in ("fp16", "mlx-q4", "affine-4")]
    provenance = {"machine": "CPU X", "cores": 2, "mlx": "0.0", "blas_preload": "", "rounds": 3, "steps": 12}
    speed = {**provenance, "arms": arms, "decode_ms": decode, "prefill_ms": {}}
    prefill = {**provenance, "arms": arms, "decode_ms": {}, "prefill_rounds": 9}
    prefill["prefill_ms"] = {"fp16": 400.0, "mlx-q4": 2000.0, "affine-4": 800.0}
    coldstart = {"rounds": 9, "blas_preloaded": False, "median_s": {"mlx_lm.server": {"start": 1.5}}}
    coldstart["ratio"] = {"affine": {"first": 1.2, "second": 0.9}}
    return speed, prefill, coldstart


def test_speed_summary_gives_speeds_against_the_references_of_the_same_run() -> None:
    from benchmarks.docs import speed_section

    text = speed_section.render(*_speed_results())
    assert "| cache | 8k ÷ mlx-q4 | 8k ÷ fp16 | 32k ÷ fp16 | prefill ÷ fp16 |" in text
    assert "| affine-4 | 4.00 | 2.00 | 0.80 | 0.50 |" in text  # 20/5, 10/5, 40/50, 400/800
    assert "| mlx-q4 | 1.00 | 0.50 | 0.50 | 0.20 |" in text
    assert "median of 9 interleaved rounds" in text and "no BLAS preloaded" in text
    assert "× mlx_lm.server's 1.50 s" in text and "| affine | 1.20 | 0.90 |" in text


def test_speed_summary_names_a_missing_results_file_and_its_command(tmp_path: Path) -> None:
    from benchmarks.docs import speed_section

    speed, _, _ = _speed_results()
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    with pytest.raises(FileNotFoundError, match=r"speed_prefill\.json is missing: `make bench-speed`"):
        speed_section.load(tmp_path)
