"""`make bench` / `make bench-quick`: KV-cache benchmark, serving benchmark, plots and tables.

Writes benchmarks/results/{kv.json, serving.json, RESULTS.md, README_results.md, pareto_*.png}. `--quick` measures
one context length with fewer arms and one serving round (a smoke run, < 5 minutes).
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks import kv, plots, readme_section, report, serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one context length, fewer arms, one serving round")
    parser.add_argument("--skip-serving", action="store_true", help="KV benchmark, plots and tables only")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped tiny model)")
    args = parser.parse_args(argv)
    started = time.time()
    common = (["--quick"] if args.quick else []) + (["--model", args.model] if args.model else [])
    kv.main(common)
    if not args.skip_serving:
        serving.main(common)
    plots.main()
    report.main()
    readme_section.main()
    print(json.dumps({"event": "bench_finished", "seconds": round(time.time() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
