"""Serving benchmark: `veloxd serve` vs plain `mlx_lm.server` on the same model.

Cold start: process start to READY (veloxd) and to the first answered completion (both).
Throughput: completion tokens per second with 1 and 4 concurrent clients. Arms are interleaved
(each round starts every server once) and medians reported. `python -m benchmarks.system.serving`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.model import model_path
from benchmarks.paths import RESULTS
from benchmarks.provenance import provenance
from testkit.ports import free_port

PROMPT = 'def parse_arguments(argv):\n    """Parse the command line and return the options."""\n'
MAX_TOKENS = 64
ARMS = (
    ("mlx_lm.server", None, None),
    ("veloxd fp16", "fp16", None),
    ("veloxd affine-4", "affine", 4),
    ("veloxd kivi-4", "kivi", 4),
)


def command(model: Path, method: str | None, bits: int | None, port: int) -> list[str]:
    if method is None:
        return [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port)]
    cmd = [sys.executable, "-m", "veloxd", "serve", "--model", str(model), "--method", method, "--port", str(port)]
    return cmd + (["--bits", str(bits)] if bits else [])


def complete(port: int, max_tokens: int, timeout: float = 120) -> int:
    """One greedy completion; returns the completion token count."""
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return int(json.loads(response.read())["usage"]["completion_tokens"])


class Server:
    """One server process; records when READY appeared on stdout (veloxd only)."""

    def __init__(self, cmd: list[str]):
        self.started = time.perf_counter()
        self.ready_at: float | None = None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # Popen(stdout=PIPE) always gives a pipe
        for line in self.proc.stdout:
            if line.startswith("VELOXD_READY ") and self.ready_at is None:
                self.ready_at = time.perf_counter() - self.started

    def first_answer(self, port: int, deadline_s: float = 180) -> float:
        """Seconds from process start to the first answered completion (polling with a deadline)."""
        deadline = time.perf_counter() + deadline_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                complete(port, 1, timeout=60)
                return time.perf_counter() - self.started
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        raise TimeoutError(f"no answer within {deadline_s}s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def throughput(port: int, clients: int, requests_per_client: int, max_tokens: int) -> float:
    """Completion tokens per second with `clients` concurrent clients."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        counts = list(
            pool.map(lambda _: sum(complete(port, max_tokens) for _ in range(requests_per_client)), range(clients))
        )
    return sum(counts) / (time.perf_counter() - start)


def measure_arm(model: Path, method: str | None, bits: int | None, quick: bool) -> dict[str, Any]:
    port = free_port()
    server = Server(command(model, method, bits, port))
    try:
        first = server.first_answer(port)
        result = {"ready_s": server.ready_at, "first_answer_s": first}
        requests = 3 if quick else 6
        result["tokens_per_s_1"] = throughput(port, 1, requests, MAX_TOKENS)
        result["tokens_per_s_4"] = throughput(port, 4, requests, MAX_TOKENS)
        return result
    finally:
        server.stop()


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, runs in samples.items():
        ok = [r for r in runs if "error" not in r]
        row: dict[str, Any] = {"runs": len(ok), "errors": [r["error"] for r in runs if "error" in r]}
        for key in ("ready_s", "first_answer_s", "tokens_per_s_1", "tokens_per_s_4"):
            values = [r[key] for r in ok if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        out[label] = row
    plain = out.get("mlx_lm.server", {})
    for row in out.values():
        for key, base_key in (
            ("ready_vs_plain_first_answer", "first_answer_s"),
            ("first_answer_vs_plain", "first_answer_s"),
            ("throughput_1_vs_plain", "tokens_per_s_1"),
            ("throughput_4_vs_plain", "tokens_per_s_4"),
        ):
            mine = row.get("ready_s" if key.startswith("ready") else base_key)
            row[key] = mine / plain[base_key] if mine is not None and plain.get(base_key) else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "serving.json")
    args = parser.parse_args(argv)
    model = model_path(args.model)
    rounds = args.rounds or (1 if args.quick else 3)
    samples: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in ARMS}
    for round_index in range(rounds):
        for label, method, bits in ARMS:
            try:
                samples[label].append(measure_arm(model, method, bits, args.quick))
            except Exception as error:  # report and keep going: one arm must not sink the others
                samples[label].append({"error": f"{type(error).__name__}: {error}"})
            print(
                json.dumps({"event": "serving_measured", "round": round_index, "arm": label, **samples[label][-1]}),
                flush=True,
            )
    report = {
        "provenance": {**provenance(model), "dtype": "float16 (weights as shipped, served as is)"},
        "rounds": rounds,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "samples": samples,
        "summary": summarize(samples),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"event": "serving_finished", "out": str(args.out)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
