"""`make bench-limits`: how quickly a worker sheds work it should not do. Real `veloxd serve` on the
shipped tiny model, on 127.0.0.1.

  sigterm (decode)   = SIGTERM sent while a 10M-token completion decodes -> the process has exited
  sigterm (prefill)  = SIGTERM sent while a prompt at the context limit prefills -> exited
  disconnect -> log  = client closes a non-streamed 10M-token request -> `request_cancelled` line
  disconnect -> idle = the same -> the worker's CPU time grows < 0.05 s over 1 s
  too-long -> 400    = a prompt 6x the context -> the 400 reply (tokenizing only, no prefill)
  sigstop -> ...     = liveness under `veloxd run`: a SIGSTOPped ready worker -> unresponsive,
                       -> restarted (new pid), -> first 200 (benchmarks/system/liveness.py says how)

Each figure is the median of --repeats runs; the worker is restarted for every SIGTERM run.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from benchmarks.paths import REPO
from benchmarks.system import liveness
from testkit.ports import free_port
from testkit.process import cpu_seconds

MODEL = REPO / "veloxd" / "assets" / "tiny-llama"
CONTEXT = json.loads((MODEL / "config.json").read_text())["max_position_embeddings"]


class Worker:
    def __init__(self) -> None:
        self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "veloxd",
            "serve",
            "--model",
            str(MODEL),
            "--method",
            "fp16",
            "--port",
            str(self.port),
            "--limit-max-tokens",
            "10000000",
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        for line in self.proc.stdout or []:
            if line.startswith("VELOXD_READY "):
                break
        else:
            raise SystemExit(f"worker did not start: {self.stderr[-5:]}")

    def _drain(self) -> None:
        for line in self.proc.stderr or []:
            self.stderr.append(line)

    def seen(self, needle: str, after: int = 0) -> bool:
        return any(needle in line for line in self.stderr[after:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def wait(predicate: Any, timeout: float = 300) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit("timed out")
        time.sleep(0.01)
    return time.monotonic() - start


def post(port: int, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def sigterm(prompt: str) -> float:
    worker = Worker()
    try:
        sock = post(worker.port, {"prompt": prompt, "max_tokens": 10_000_000})
        wait(lambda: worker.seen("Prompt processing progress") if len(prompt) < 100 else worker.seen("Prompt Cache"))
        if len(prompt) >= 100:
            time.sleep(0.2)  # inside the prefill of thousands of tokens
        worker.proc.send_signal(signal.SIGTERM)
        seconds = wait(lambda: worker.proc.poll() is not None)
        sock.close()
        return seconds
    finally:
        worker.close()


def disconnect(worker: Worker) -> tuple[float, float]:
    mark = len(worker.stderr)
    sock = post(worker.port, {"prompt": "once upon a time", "max_tokens": 10_000_000})
    wait(lambda: worker.seen("Prompt processing progress", mark))
    time.sleep(0.5)
    sock.close()
    start = time.monotonic()
    wait(lambda: worker.seen("request_cancelled", mark))
    logged = time.monotonic() - start
    while True:
        before = cpu_seconds(worker.proc.pid)
        time.sleep(1.0)
        if cpu_seconds(worker.proc.pid) - before < 0.05:
            return logged, time.monotonic() - start - 1.0


def too_long(worker: Worker) -> float:
    body = json.dumps({"prompt": "hello world " * (3 * CONTEXT), "max_tokens": 1}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{worker.port}/v1/completions", data=body)
    start = time.monotonic()
    try:
        urllib.request.urlopen(request, timeout=600)
        raise SystemExit("a too-long prompt was accepted")
    except urllib.error.HTTPError as err:
        assert err.code == 400, err.code
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    long_prompt = "hello world " * (CONTEXT // 5 - 20)  # ~5 tokens a repeat: just under the context
    rows: dict[str, list[float]] = {
        "sigterm (decode)": [],
        "sigterm (prefill)": [],
        "disconnect -> log": [],
        "disconnect -> idle": [],
        "too-long -> 400": [],
    }
    for _ in range(args.repeats):
        rows["sigterm (decode)"].append(sigterm("once upon a time"))
        rows["sigterm (prefill)"].append(sigterm(long_prompt))
    worker = Worker()
    try:
        for _ in range(args.repeats):
            logged, idle = disconnect(worker)
            rows["disconnect -> log"].append(logged)
            rows["disconnect -> idle"].append(idle)
            rows["too-long -> 400"].append(too_long(worker))
    finally:
        worker.close()
    rows.update(liveness.measure(args.repeats))
    print(f"{'what':<24} {'median s':>9} {'max s':>7}   (tiny-llama, context {CONTEXT}, {args.repeats} runs)")
    for name, values in rows.items():
        print(f"{name:<24} {statistics.median(values):>9.2f} {max(values):>7.2f}")
    print(f"liveness with {liveness.settings()}")


if __name__ == "__main__":
    main()
