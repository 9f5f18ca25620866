"""`make bench-distributed`: one server as one process vs as a 2-rank group, side by side, in one run.

Arms (the shipped tiny-llama, method affine 4-bit, loopback, ring backend, both ranks on this machine):
  single    `veloxd serve`                                    one process
  group     `python -m veloxd.distributed.launcher` (MLX's launcher with veloxd's pump) + 2 ranks of
            `veloxd serve --distributed tensor`: what the daemon runs for a `distributed:` entry
  upstream  `mlx.launch -n 2 --backend ring` + `mlx_lm server` (mlx_lm's own fp16 cache): what MLX costs unaided

  READY time    spawn -> the READY line (upstream: its "Starting httpd" line; it loads lazily, so not compared)
  latency       median wall time of a 16-token greedy completion (after one warm-up request)
  tokens/s      completion tokens / wall time of a 256-token greedy completion
  idle CPU      CPU ratio: utime+stime of each process (/proc/PID/stat) over an idle window, divided
                by the window's wall time (1.00 = one core busy the whole time); launcher, rank 0 and
                rank 1 separately (rank pids from the group's READY line)

Every figure is measured on this machine while other work shares its CPUs: compare the arms
within one run (ratios), not against another machine. Two ranks on one machine share its cores,
so the group is not expected to be faster here; on two Macs each rank has its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.paths import REPO
from testkit.ports import consecutive_ports, free_port
from testkit.process import children, cpu_seconds

MODEL = REPO / "veloxd" / "assets" / "tiny-llama"
METHOD = ["--method", "affine", "--bits", "4"]
PROMPT = "The history of the house begins with"


def ring_port() -> int:
    """A base port whose successor is free too (ring rank r listens on base + r)."""
    return consecutive_ports(2)


def machine() -> str:
    """One line describing where the figures come from (they are only comparable within a run)."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "?")
    blas = "OpenBLAS preloaded" if "openblas" in os.environ.get("LD_PRELOAD", "") else "no OpenBLAS"
    from importlib.metadata import version

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{stamp}; {model}, {os.cpu_count()} cores (load {load}); MLX {version('mlx')} CPU, {blas}"


class Arm:
    """A running server: its process (group), output lines, and when it printed `marker`."""

    def __init__(self, argv: list[str], marker: str) -> None:
        self.started = time.monotonic()
        self.ready_at: float | None = None
        self.lines: list[str] = []
        self.marker = marker
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.ready_at is None and self.marker in line:
                self.ready_at = time.monotonic()

    def wait_ready(self, timeout: float = 600) -> float:
        deadline = time.monotonic() + timeout
        while self.ready_at is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.marker!r} never came: {self.lines[-20:]}")
            time.sleep(0.05)
        return self.ready_at - self.started

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def complete(port: int, max_tokens: int) -> tuple[float, int]:
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as response:
        usage = json.loads(response.read())["usage"]
    return time.monotonic() - started, int(usage["completion_tokens"])


SETTLE_S = 3.0  # after the last request: the generation loop goes back to waiting


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU ratio of each process over an idle window: CPU seconds / wall seconds (1.0 = one core)."""
    time.sleep(SETTLE_S)
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {name: round((cpu_seconds(pid) - before[name]) / wall, 4) for name, pid in pids.items()}


def ready_payload(arm: Arm, prefix: str) -> dict[str, Any]:
    line = next(line for line in arm.lines if line.startswith(prefix))
    return json.loads(line[len(prefix) :])


def serve_figures(port: int, requests: int) -> dict[str, Any]:
    complete(port, 4)  # warm-up
    latencies = [complete(port, 16)[0] for _ in range(requests)]
    wall, tokens = complete(port, 256)
    return {"latency_s": round(statistics.median(latencies), 3), "tokens_per_s": round(tokens / wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=5)
    # raw/ is not committed: docs/results.md carries the figures of a run, dated
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "raw" / "distributed.json")
    args = parser.parse_args()
    py = sys.executable
    results: dict[str, Any] = {"machine": machine()}

    port = free_port()
    single = Arm([py, "-m", "veloxd", "serve", "--model", str(MODEL), *METHOD, "--port", str(port)], "VELOXD_READY")
    try:
        ready_s = single.wait_ready()
        results["single"] = {
            "ready_s": round(ready_s, 2),
            **serve_figures(port, args.requests),
            "idle_cpu": idle_cpu({"worker": single.proc.pid}, args.idle_s),
        }
    finally:
        single.stop()

    port = free_port()
    launcher = ["-m", "veloxd.distributed.launcher", "--backend", "ring", "--starting-port", str(ring_port())]
    launcher += ["--hosts", "127.0.0.1,127.0.0.1", "--env", "PYTHONUNBUFFERED=1", "--"]
    serve = ["-m", "veloxd", "serve", "--model", str(MODEL), *METHOD, "--port", str(port)]
    group = Arm([py, *launcher, py, *serve, "--distributed", "tensor", "--lifeline-fd", "0"], "[rank 0] VELOXD_READY")
    try:
        ready_s = group.wait_ready()
        ranks = {
            f"rank {r['rank']}": r["pid"]
            for r in ready_payload(group, "[rank 0] VELOXD_READY ")["distributed"]["ranks"]
        }
        results["group"] = {
            "ready_s": round(ready_s, 2),
            **serve_figures(port, args.requests),
            "idle_cpu": idle_cpu({"launcher": group.proc.pid, **ranks}, args.idle_s),
        }
    finally:
        group.stop()

    port = free_port()
    mlx_launch = ["-c", "from mlx._distributed_utils.launch import main; main()", "-n", "2", "--backend", "ring"]
    mlx_launch += ["--starting-port", str(ring_port()), "--"]
    mlx_lm_server = ["-m", "mlx_lm", "server", "--model", str(MODEL), "--port", str(port)]
    upstream = Arm([py, *mlx_launch, py, *mlx_lm_server], "Starting httpd")
    try:
        upstream.wait_ready()
        first, second = children(upstream.proc.pid)[:2]  # no READY line: MLX's launcher starts rank 0 first
        results["upstream"] = {
            **serve_figures(port, args.requests),  # its warm-up request loads the model
            "idle_cpu": idle_cpu({"launcher": upstream.proc.pid, "rank 0": first, "rank 1": second}, args.idle_s),
        }
    finally:
        upstream.stop()

    report(results, args.idle_s)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"model": "veloxd/assets/tiny-llama", "method": "affine 4-bit", "idle_s": args.idle_s, **results},
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {args.json.relative_to(REPO)}")
    return 0


def report(results: dict[str, Any], idle_s: float) -> None:
    single, group, upstream = results["single"], results["group"], results["upstream"]
    print("single process vs 2-rank group (tensor parallel, ring over loopback, tiny-llama, affine 4-bit)")
    print(f"machine: {results['machine']}")
    print(f"{'':26}{'single':>10}{'2 ranks':>10}{'2r/single':>11}{'upstream 2r':>13}")
    for key, label in (
        ("ready_s", "READY time (s)"),
        ("latency_s", "16-token latency (s)"),
        ("tokens_per_s", "tokens/s (256 tokens)"),
    ):
        theirs = upstream.get(key, "-")
        print(f"{label:26}{single[key]:>10}{group[key]:>10}{group[key] / single[key]:>11.2f}{theirs:>13}")
    print("(upstream: mlx.launch + mlx_lm server with mlx_lm's fp16 cache; it loads on the first request)")
    print(f"\nidle CPU ratio over {idle_s:g} s (CPU seconds / wall seconds; 1.000 = one core busy):")
    print(f"  {'':22}{'launcher':>10}{'rank 0':>10}{'rank 1':>10}{'sum':>10}")
    rows = [("single veloxd serve", {"rank 0": single["idle_cpu"]["worker"]})]
    rows += [("veloxd group", group["idle_cpu"]), ("mlx.launch + mlx_lm", upstream["idle_cpu"])]
    for name, cpu in rows:
        cells = "".join(f"{cpu[k]:>10.3f}" if k in cpu else f"{'-':>10}" for k in ("launcher", "rank 0", "rank 1"))
        print(f"  {name:<22}{cells}{sum(cpu.values()):>10.3f}")


if __name__ == "__main__":
    sys.exit(main())
