"""docs/results.md's measured tables are benchmarks/results/'s figures, as `make bench` splices them."""

from __future__ import annotations

import json

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
