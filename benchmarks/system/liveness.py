"""The liveness part of `make bench-limits`: a ready real worker (shipped tiny model) under a real
`veloxd run` is SIGSTOPped; how long until the daemon marks it unresponsive, until the new worker is
spawned, and until the first 200 from the new one.

  sigstop -> unresponsive = SIGSTOP sent -> the state file says `unresponsive`
  sigstop -> restart      = SIGSTOP sent -> a new pid in the state file (SIGTERM, then SIGKILL after
                            stop_timeout_s: a stopped process cannot act on SIGTERM; then backoff)
  sigstop -> first 200    = SIGSTOP sent -> a completion answered 200 by the new worker

Expected: unresponsive ~ interval_s x failures (+ timeout_s), restart ~ that + stop_timeout_s +
backoff_initial_s, first 200 ~ that + the worker's cold start. Figures follow the health settings
used (printed with them), not a fixed number.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.paths import REPO
from benchmarks.system.daemon import Daemon
from testkit.ports import free_port

MODEL = REPO / "veloxd" / "assets" / "tiny-llama"
HEALTH = {"interval_s": 1.0, "timeout_s": 1.0, "failures": 3}
STOP_TIMEOUT_S = 2.0
RESTART = {"max_failures": 1000, "window_s": 60, "backoff_initial_s": 0.2, "backoff_max_s": 1.0}


def answered(port: int) -> bool:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def one_round(root: Path) -> dict[str, float]:
    port = free_port()
    server = {
        "model": str(MODEL),
        "port": port,
        "method": "fp16",
        "stop_timeout_s": STOP_TIMEOUT_S,
        "restart": RESTART,
        "health": HEALTH,
    }
    config = root / "veloxd.yaml"
    config.write_text(f"version: 1\nservers:\n  tiny: {json.dumps(server)}\n")
    daemon = Daemon(root, config)
    try:
        up = daemon.wait(daemon.all_ready, 600, "the worker to be ready")
        pid = up["tiny"]["pid"]
        start = time.monotonic()
        os.kill(pid, signal.SIGSTOP)

        def tiny() -> dict[str, Any]:
            return daemon.servers().get("tiny") or {}

        daemon.wait(lambda: tiny().get("state") == "unresponsive", 300, "unresponsive")
        marked = time.monotonic() - start
        daemon.wait(lambda: tiny().get("pid") not in (None, pid), 300, "a new worker")
        restarted = time.monotonic() - start
        daemon.wait(lambda: answered(port), 600, "a 200 from the new worker")
        first_200 = time.monotonic() - start
        return {"sigstop -> unresponsive": marked, "sigstop -> restart": restarted, "sigstop -> first 200": first_200}
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.wait(120)


def measure(repeats: int) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="veloxd-liveness-") as tmp:
            for name, value in one_round(Path(tmp)).items():
                rows.setdefault(name, []).append(value)
    return rows


def settings() -> str:
    return f"health {HEALTH}, stop_timeout_s {STOP_TIMEOUT_S}, backoff_initial_s {RESTART['backoff_initial_s']}"


def main() -> None:
    """`python -m benchmarks.system.liveness [REPEATS]`: this part of bench-limits alone."""
    import statistics
    import sys

    rows = measure(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    for name, values in rows.items():
        print(f"{name:<24} {statistics.median(values):>9.2f} {max(values):>7.2f}")
    print(f"liveness with {settings()}")


if __name__ == "__main__":
    main()
