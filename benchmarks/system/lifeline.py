"""`python -m benchmarks.system.lifeline`: how soon a worker that is still starting (importing MLX, loading the
model) leaves after its daemon is SIGKILLed. Real `veloxd run`, real worker on the shipped model.

  gone after = wall time from the daemon's death (its exit reaped) until the worker's pid is gone,
               for kills at growing delays after `server_starting` (interpreter start, imports, load)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.system.daemon import REPO, Daemon
from testkit.ports import free_port

MODEL = REPO / "veloxd" / "assets" / "tiny-llama"


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def one_kill(delay_s: float) -> float:
    with tempfile.TemporaryDirectory(prefix="veloxd-lifeline-") as tmp:
        root = Path(tmp)
        config = root / "veloxd.yaml"
        entry = {"model": str(MODEL), "port": free_port(), "method": "fp16", "ready_timeout_s": 300}
        config.write_text(f"version: 1\nservers:\n  slow: {json.dumps(entry)}\n")
        daemon = Daemon(root, config)
        try:
            starting = daemon.wait(
                lambda: next((r for r in daemon.records() if r["event"] == "server_starting" and r.get("pid")), None),
                120,
                "server_starting",
            )
            time.sleep(delay_s)
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(60)
            died = time.monotonic()
            while alive(starting["pid"]) and time.monotonic() - died < 60:
                time.sleep(0.005)
            return time.monotonic() - died
        finally:
            if daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays", default="0,0.5,1,2,4", help="seconds after server_starting, comma-separated")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    gone = [one_kill(d) for d in delays]
    print(f"starting worker gone after its daemon's SIGKILL ({os.cpu_count()} CPU cores):")
    for delay, seconds in zip(delays, gone, strict=True):
        print(f"  killed {delay:.1f} s after server_starting: gone after {seconds:.2f} s")
    print(
        f"  max {max(gone):.2f} s, median {statistics.median(gone):.2f} s (target < 2 s: "
        f"{'met' if max(gone) < 2 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
