"""docs/results.md's current speed summary, generated from the latest speed results.

Each fact has one file: decode from `speed.json` (`benchmarks.kv.speed`), prefill from
`speed_prefill.json` (a prefill-only run with more rounds), cold start from `coldstart.json`.
`make bench-speed` writes all three, then runs this to splice the "speed" region of
docs/results.md; the session-by-session sections below it are written by hand.

    python -m benchmarks.docs.speed_section [--print]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.docs.readme_section import DOCS_RESULTS, splice
from benchmarks.paths import RESULTS

FILES = ("speed.json", "speed_prefill.json", "coldstart.json")
REGION = "speed"


def _ratio(reference: float | None, value: float | None) -> str:
    """Speed of `value` relative to `reference` (> 1: faster), from times; n/a when either is missing."""
    return "n/a" if reference is None or value is None else f"{reference / value:.2f}"


def decode_table(speed: dict[str, Any], prefill: dict[str, Any]) -> list[str]:
    """One row per arm: 8k ÷ mlx-q4 and ÷ fp16 (single request), 32k ÷ fp16, prefill ÷ fp16."""
    decode = speed["decode_ms"]
    contexts = sorted(decode, key=int)
    mid, long = ("8192" if "8192" in decode else contexts[0]), contexts[-1]
    pre = prefill["prefill_ms"]
    k = {c: f"{int(c) // 1024}k" for c in contexts}
    head = f"| cache | {k[mid]} ÷ mlx-q4 | {k[mid]} ÷ fp16 | {k[long]} ÷ fp16 | prefill ÷ fp16 |"
    lines = [head, "|---|---|---|---|---|"]
    for arm in speed["arms"]:
        label = arm["label"]
        single = {c: decode[c][label]["single"] for c in (mid, long)}
        row = [
            _ratio(decode[mid]["mlx-q4"]["single"], single[mid]),
            _ratio(decode[mid]["fp16"]["single"], single[mid]),
            _ratio(decode[long]["fp16"]["single"], single[long]),
            _ratio(pre.get("fp16"), pre.get(label)),
        ]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def coldstart_table(coldstart: dict[str, Any]) -> list[str]:
    """First and second start of each method, times as a multiple of mlx_lm.server's (< 1: sooner)."""
    reference = coldstart["median_s"]["mlx_lm.server"]["start"]
    head = f"| method | first start, × mlx_lm.server's {reference:.2f} s | second start, × the same |"
    lines = [head, "|---|---|---|"]
    for method, ratio in coldstart["ratio"].items():
        lines.append(f"| {method} | {ratio['first']:.2f} | {ratio['second']:.2f} |")
    return lines


def _preload(value: str | bool) -> str:
    return "OpenBLAS preloaded" if value else "no BLAS preloaded"


def render(speed: dict[str, Any], prefill: dict[str, Any], coldstart: dict[str, Any]) -> str:
    """The region's markdown: decode and prefill ratios, then cold start, each with its run's provenance."""
    rounds = prefill.get("prefill_rounds", prefill["rounds"])
    prompt = prefill.get("prefill_prompt", 1024)  # results written before the flag existed used 1024
    lines = [
        "Speeds as ratios (> 1: faster), each measured side by side in one run. Decode: "
        f"{speed['steps']} single-token steps x {speed['rounds']} interleaved rounds per context "
        f"(`benchmarks/results/speed.json`); prefill: one 512-token chunk after {prompt:,} tokens, median of "
        f"{rounds} interleaved rounds (`speed_prefill.json`). {speed['machine']}, {speed['cores']} cores, "
        f"MLX {speed['mlx']} CPU float32, {_preload(speed['blas_preload'])}. Eviction methods and hybrids "
        "hold 1,024 tokens per layer.",
        "",
        *decode_table(speed, prefill),
        "",
        f"Cold start, spawn to the first answered chat completion, times (< 1: sooner than mlx_lm.server; "
        f"`coldstart.json`, {coldstart['rounds']} interleaved rounds, medians, "
        f"{_preload(coldstart['blas_preloaded'])}; a second start reads the cached memory figure):",
        "",
        *coldstart_table(coldstart),
    ]
    return "\n".join(lines)


def load(results: Path = RESULTS) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The three result files; FileNotFoundError naming the one missing and the command that writes it."""
    found = []
    for name in FILES:
        path = results / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: `make bench-speed` writes it")
        found.append(json.loads(path.read_text()))
    speed, prefill, coldstart = found
    return speed, prefill, coldstart


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the region instead of splicing the page")
    args = parser.parse_args(argv)
    text = render(*load())
    if args.print:
        print(text)
    else:
        DOCS_RESULTS.write_text(splice(DOCS_RESULTS.read_text(), {REGION: text}))
        print(DOCS_RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
