"""Cold start: process spawn -> first answered chat completion, `veloxd serve` vs `mlx_lm.server`.

Every veloxd arm starts twice per round: first with an empty state directory (its KV memory
figure is measured), then again on the same directory (the figure is read back, `source:
"cached"`). Rounds interleave every arm, so a machine that gets busier slows all arms alike;
medians over rounds, and each median as a ratio of mlx_lm.server's. Targets (the project's cold-start goal): second
start <= 1.1x mlx_lm.server for every arm, first start <= 1.5x.

`python -m benchmarks.system.coldstart [--rounds N] [--model DIR] [--methods fp16,kivi,...]`;
`measure_cold_start(...)` returns the same figures as a dict (for a speed report beside the decode figures of benchmarks/kv/speed.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.model import model_path
from testkit.ports import free_port

MLX_LM = "mlx_lm.server"
METHODS = ("fp16", "kivi", "snapkv", "turboquant_mse")
TARGETS = {"first": 1.5, "second": 1.1}
DEADLINE_S = 300.0  # one start on a busy machine; past it the arm failed


def command(model: Path, method: str | None, port: int) -> list[str]:
    if method is None:
        return [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port)]
    return [sys.executable, "-m", "veloxd", "serve", "--model", str(model), "--method", method, "--port", str(port)]


def chat_once(port: int) -> bool:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0.0})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def start_once(model: Path, method: str | None, state_dir: Path) -> dict[str, Any]:
    """One start: seconds from spawn to the first answered chat completion, and READY's figure label."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VELOXD_STATE_DIR": str(state_dir)}
    started = time.perf_counter()
    proc = subprocess.Popen(
        command(model, method, port), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        while time.perf_counter() - started < DEADLINE_S:
            if proc.poll() is not None:
                raise RuntimeError(f"{command(model, method, port)} exited with {proc.returncode}")
            if chat_once(port):
                seconds = time.perf_counter() - started
                break
            time.sleep(0.02)
        else:
            raise TimeoutError(f"no answer within {DEADLINE_S} s")
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    source = None
    for line in out.splitlines():
        if line.startswith("VELOXD_READY "):
            source = json.loads(line[len("VELOXD_READY ") :]).get("kv_memory", {}).get("source")
    return {"seconds": seconds, "source": source}


def measure_cold_start(
    model: str | Path | None = None, methods: tuple[str, ...] = METHODS, rounds: int = 3
) -> dict[str, Any]:
    """Spawn -> first answered chat completion, interleaved rounds, medians and ratios to mlx_lm.server.

    Returns {"model", "rounds", "samples": {arm: {phase: [s, ...]}}, "median_s": {arm: {phase: s}},
    "ratio": {arm: {phase: x}}, "sources": {arm: {phase: [label, ...]}}, "targets", "met"}."""
    path = model_path(model)
    samples: dict[str, dict[str, list[float]]] = {MLX_LM: {"start": []}}
    sources: dict[str, dict[str, list[Any]]] = {}
    for method in methods:
        samples[method] = {"first": [], "second": []}
        sources[method] = {"first": [], "second": []}
    with tempfile.TemporaryDirectory(prefix="veloxd-coldstart-") as scratch:
        for round_no in range(rounds):
            samples[MLX_LM]["start"].append(start_once(path, None, Path(scratch) / "unused")["seconds"])
            print(f"  {MLX_LM}: {samples[MLX_LM]['start'][-1]:.2f} s", file=sys.stderr, flush=True)
            for method in methods:
                state = Path(scratch) / f"{method}-{round_no}"  # empty: the first start measures
                for phase in ("first", "second"):
                    result = start_once(path, method, state)
                    samples[method][phase].append(result["seconds"])
                    sources[method][phase].append(result["source"])
                    print(
                        f"  {method} {phase}: {result['seconds']:.2f} s ({result['source']})",
                        file=sys.stderr,
                        flush=True,
                    )
            print(f"  round {round_no + 1}/{rounds} done", file=sys.stderr, flush=True)
    base = statistics.median(samples[MLX_LM]["start"])
    median = {arm: {ph: statistics.median(xs) for ph, xs in phases.items()} for arm, phases in samples.items()}
    ratio = {m: {ph: median[m][ph] / base for ph in ("first", "second")} for m in methods}
    met = {m: {ph: ratio[m][ph] <= TARGETS[ph] for ph in ("first", "second")} for m in methods}
    return {
        "model": str(path),
        "rounds": rounds,
        "blas_preloaded": "openblas" in os.environ.get("LD_PRELOAD", ""),
        "samples": samples,
        "median_s": median,
        "ratio": ratio,
        "sources": sources,
        "targets": TARGETS,
        "met": met,
    }


def report(result: dict[str, Any]) -> str:
    median, ratio = result["median_s"], result["ratio"]
    lines = [
        f"cold start: spawn -> first answered chat completion, {result['model']}, {result['rounds']} interleaved "
        f"rounds, medians (OpenBLAS preloaded: {result['blas_preloaded']})",
        f"  {MLX_LM:22}{median[MLX_LM]['start']:>8.2f} s",
        f"  {'veloxd serve':22}{'first':>8}{'ratio':>8}{'second':>9}{'ratio':>8}  figure source (first/second)",
    ]
    for method, phases in ratio.items():
        srcs = "/".join(sorted(set(map(str, result["sources"][method]["first"])))) + " / "
        srcs += "/".join(sorted(set(map(str, result["sources"][method]["second"]))))
        lines.append(
            f"  {method:22}{median[method]['first']:>7.2f}s{phases['first']:>7.2f}x"
            f"{median[method]['second']:>8.2f}s{phases['second']:>7.2f}x  {srcs}"
        )
    lines.append(
        f"  targets: second start <= {TARGETS['second']}x, first <= {TARGETS['first']}x; missed: "
        + (", ".join(f"{m} {ph}" for m, phs in result["met"].items() for ph, ok in phs.items() if not ok) or "none")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: the shipped tiny-llama)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated veloxd methods")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    result = measure_cold_start(args.model, tuple(args.methods.split(",")), args.rounds)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
