"""`make bench` / `make bench-quick`: KV-cache benchmark, serving benchmark, plots and tables.

`make bench` writes benchmarks/results/{kv.json, pretrained.{json,md}, retrieval.{json,md}, retrieval_heatmaps.png,
kv_peak.json, serving.json, RESULTS.md, README_results.md, pareto_*.png}. `--quick` (one context
length, fewer arms, one serving round; a smoke run of a few minutes) writes the same files under
benchmarks/results/quick/, leaving the full results alone.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.docs import plots, readme_section, report
from benchmarks.kv import peak as kv_peak
from benchmarks.kv import pretrained, retrieval
from benchmarks.kv import quality as kv
from benchmarks.paths import RESULTS
from benchmarks.system import serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one context length, fewer arms, one serving round")
    parser.add_argument("--skip-serving", action="store_true", help="KV benchmark, plots and tables only")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped tiny model)")
    args = parser.parse_args(argv)
    started = time.time()
    results = RESULTS / "quick" if args.quick else RESULTS
    common = (["--quick"] if args.quick else []) + (["--model", args.model] if args.model else [])
    kv.main(common + ["--out", str(results / "kv.json")])
    # the real pretrained model (SmolLM2-135M), its KL printed beside the shipped models' from kv.json
    pretrained.main(["--out-dir", str(results)] + (["--quick"] if args.quick else []))
    # pass-key accuracy per depth on the retrieval model (the shipped one does not retrieve)
    retrieval.main(["--out-dir", str(results)] + (["--contexts", "1024", "--keys", "1"] if args.quick else []))
    # one layer's decode and prefill peak per method at GQA 16 (the ratio real models reach)
    kv_peak.main(["--json", str(results / "kv_peak.json")] + (["--context", "2048"] if args.quick else []))
    if not args.skip_serving:
        serving.main(common + ["--out", str(results / "serving.json")])
    plots.main(results)
    report.main(results)
    readme_section.main(results, page=None if args.quick else readme_section.DOCS_RESULTS)
    print(
        json.dumps({"event": "bench_finished", "seconds": round(time.time() - started, 1), "results": str(results)}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
