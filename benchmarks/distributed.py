"""`make bench-distributed`: one server as one process vs as a 2-rank group, side by side, in one run.

Arms (the shipped tiny-llama, method affine 4-bit, loopback, ring backend, both ranks on this machine):
  single    `veloxd serve`                                    one process
  group     `python -m veloxd.distributed.launcher` (MLX's launcher with veloxd's pump) + 2 ranks of
            `veloxd serve --distributed tensor`: what the daemon runs for a `distributed:` entry
  upstream  `mlx.launch -n 2 --backend ring` + `mlx_lm server` (mlx_lm's own fp16 cache): what MLX costs unaided

  READY time    spawn -> the READY line (upstream: its "Starting httpd" line; it loads lazily, so not compared)
  latency       median wall time of a 16-token greedy completion (after one warm-up request)
  tokens/s      completion tokens / wall time of a 256-token greedy completion
  idle CPU      utime+stime of each process (/proc/PID/stat) over an idle window / wall time, in % of one core

Every figure is measured on this machine while other work shares its CPUs: compare the arms
within one run (ratios), not against another machine. Two ranks on one machine share its cores,
so the group is not expected to be faster here; on two Macs each rank has its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "veloxd" / "assets" / "tiny-llama"
METHOD = ["--method", "affine", "--bits", "4"]
PROMPT = "The history of the house begins with"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return sorted(out)


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
                raise SystemExit(f"{self.proc.args[:4]} never became ready: {self.lines[-20:]}")
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


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: round(100 * (cpu_seconds(pid) - before[name]) / seconds, 1) for name, pid in pids.items()}


def serve_figures(port: int, requests: int) -> dict[str, Any]:
    complete(port, 4)  # warm-up
    latencies = [complete(port, 16)[0] for _ in range(requests)]
    wall, tokens = complete(port, 256)
    return {"latency_s": round(statistics.median(latencies), 3), "tokens_per_s": round(tokens / wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "distributed.json")
    args = parser.parse_args()
    py = sys.executable
    results: dict[str, Any] = {}

    port = free_port()
    single = Arm([py, "-m", "veloxd", "serve", "--model", str(MODEL), *METHOD, "--port", str(port)], "VELOXD_READY")
    try:
        ready_s = single.wait_ready()
        results["single"] = {
            "ready_s": round(ready_s, 2),
            **serve_figures(port, args.requests),
            "idle_cpu_pct": idle_cpu({"worker": single.proc.pid}, args.idle_s),
        }
    finally:
        single.stop()

    port = free_port()
    group = Arm(
        [
            py,
            "-m",
            "veloxd.distributed.launcher",
            "--backend",
            "ring",
            "--starting-port",
            str(free_port()),
            "--hosts",
            "127.0.0.1,127.0.0.1",
            "--env",
            "PYTHONUNBUFFERED=1",
            "--",
            py,
            "-m",
            "veloxd",
            "serve",
            "--model",
            str(MODEL),
            *METHOD,
            "--port",
            str(port),
            "--distributed",
            "tensor",
            "--lifeline-fd",
            "0",
        ],
        "[rank 0] VELOXD_READY",
    )
    try:
        ready_s = group.wait_ready()
        ranks = children(group.proc.pid)
        results["group"] = {
            "ready_s": round(ready_s, 2),
            **serve_figures(port, args.requests),
            "idle_cpu_pct": idle_cpu({"launcher": group.proc.pid, "rank 0": ranks[0], "rank 1": ranks[1]}, args.idle_s),
        }
    finally:
        group.stop()

    port = free_port()
    upstream = Arm(
        [
            py,
            "-c",
            "from mlx._distributed_utils.launch import main; main()",
            "-n",
            "2",
            "--backend",
            "ring",
            "--starting-port",
            str(free_port()),
            "--",
            py,
            "-m",
            "mlx_lm",
            "server",
            "--model",
            str(MODEL),
            "--port",
            str(port),
        ],
        "Starting httpd",
    )
    try:
        upstream.wait_ready()
        ranks = children(upstream.proc.pid)
        results["upstream"] = {
            **serve_figures(port, args.requests),  # its warm-up request loads the model
            "idle_cpu_pct": idle_cpu(
                {"launcher": upstream.proc.pid, "rank 0": ranks[0], "rank 1": ranks[1]}, args.idle_s
            ),
        }
    finally:
        upstream.stop()

    report(results, args.idle_s)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"model": "veloxd/assets/tiny-llama", "method": "affine 4-bit", "idle_s": args.idle_s, **results}, indent=2
        )
        + "\n"
    )
    print(f"\nwrote {args.json.relative_to(REPO)}")
    return 0


def report(results: dict[str, Any], idle_s: float) -> None:
    single, group, upstream = results["single"], results["group"], results["upstream"]
    print("single process vs 2-rank group (tensor parallel, ring over loopback, tiny-llama, affine 4-bit)")
    print(f"{'':24}{'single':>12}{'2 ranks':>12}{'ratio':>10}{'upstream 2 ranks':>20}")
    for key, label in (
        ("ready_s", "READY time (s)"),
        ("latency_s", "16-token latency (s)"),
        ("tokens_per_s", "tokens/s (256 tokens)"),
    ):
        theirs = upstream.get(key, "-")
        print(f"{label:24}{single[key]:>12}{group[key]:>12}{group[key] / single[key]:>10.2f}{theirs:>20}")
    print("(upstream: mlx.launch + mlx_lm server with mlx_lm's fp16 cache; it loads on the first request)")
    print(f"\nidle CPU over {idle_s:g} s, % of one core (CPU ratios on this shared machine):")
    print(f"  single worker            {single['idle_cpu_pct']['worker']:>6}")
    for arm in ("group", "upstream"):
        name = "veloxd group" if arm == "group" else "mlx.launch + mlx_lm"
        cpu = results[arm]["idle_cpu_pct"]
        print(f"  {name:<22} launcher {cpu['launcher']:>6}   rank 0 {cpu['rank 0']:>6}   rank 1 {cpu['rank 1']:>6}")


if __name__ == "__main__":
    sys.exit(main())
