"""`make bench-daemon`: how quickly an edit reaches a ready server, what the daemon costs when idle,
and whether unchanged servers survive many reloads. Real `veloxd run`, real workers on the tiny model.

  reload latency = log timestamp of the changed server's `server_ready`
                   - wall time just before the edited file was saved (os.replace)
                   - that worker's own cold start (`startup_s`: spawn -> READY line and /health 200)
  idle CPU       = the daemon's utime+stime (/proc/PID/stat, or `ps -o time=` elsewhere) over the idle
                   window / wall time, with 2 READY servers and nothing happening
  pid stability  = the unchanged server's pid before and after every reload
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.paths import REPO
from testkit.daemon import daemon_argv
from testkit.ports import free_port
from testkit.process import cpu_seconds

RESTART = {"max_failures": 1000, "window_s": 60, "backoff_initial_s": 0.2, "backoff_max_s": 1.0}


def config_text(model: Path, ports: tuple[int, int], bits: int) -> str:
    keep = {"model": str(model), "port": ports[0], "method": "affine", "bits": 4, "restart": RESTART}
    edited = {"model": str(model), "port": ports[1], "method": "affine", "bits": bits, "restart": RESTART}
    return f"version: 1\nservers:\n  keep: {json.dumps(keep)}\n  edited: {json.dumps(edited)}\n"


def spawn_daemon(config: Path, log: Path, state: Path) -> subprocess.Popen:
    """`veloxd run` on `config`, its JSON log and state in the given places; the benchmark reads those, not stdout."""
    return subprocess.Popen(
        daemon_argv(config, log, state), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


class Daemon:
    def __init__(self, root: Path, config: Path) -> None:
        self.log = root / "veloxd.jsonl"
        self.state = root / "state"
        self.proc = spawn_daemon(config, self.log, self.state)

    def records(self) -> list[dict[str, Any]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line]

    def wait(self, predicate: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the daemon exited with {self.proc.returncode} while waiting for {what}")
            value = predicate()
            if value:
                return value
            time.sleep(0.02)
        raise SystemExit(f"timed out after {timeout}s waiting for {what}")

    def servers(self) -> dict[str, Any]:
        try:
            return json.loads((self.state / "state.json").read_text())["servers"]
        except (OSError, ValueError, KeyError):
            return {}

    def all_ready(self) -> dict[str, Any] | None:
        servers = self.servers()
        return servers if servers and all(s["state"] == "ready" for s in servers.values()) else None


def timestamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reloads", type=int, default=50)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="10 reloads, 10 s idle")
    args = parser.parse_args()
    reloads, idle_s = (10, 10.0) if args.quick else (args.reloads, args.idle_s)

    from testkit.tinymodel import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="veloxd-bench-") as tmp:
        root = Path(tmp)
        model = write_tiny_model(root / "tiny-llama")
        config = root / "veloxd.yaml"
        ports = (free_port(), free_port())
        config.write_text(config_text(model, ports, bits=4))
        daemon = Daemon(root, config)
        try:
            first = daemon.wait(daemon.all_ready, 300, "two READY servers")
            keep_pid = first["keep"]["pid"]
            latencies, cold_starts, detect, stops = [], [], [], []
            for i in range(reloads):
                bits = (8, 4)[i % 2]
                text = config_text(model, ports, bits)
                mark = len(daemon.records())
                tmp_file = root / ".veloxd.yaml.tmp"
                tmp_file.write_text(text)
                saved_at = time.time()
                os.replace(tmp_file, config)
                sha = hashlib.sha256(text.encode()).hexdigest()

                def ready_after(mark: int = mark) -> dict[str, Any] | None:
                    return next(
                        (
                            r
                            for r in daemon.records()[mark:]
                            if r["event"] == "server_ready" and r["server"] == "edited"
                        ),
                        None,
                    )

                ready = daemon.wait(ready_after, 300, f"reload {i + 1}: edited server READY")
                records = daemon.records()[mark:]
                reloaded = next(r for r in records if r["event"] == "config_reloaded")
                stopping = next(r for r in records if r["event"] == "server_stopping" and r["server"] == "edited")
                stopped = next(r for r in records if r["event"] == "server_stopped" and r["server"] == "edited")
                assert reloaded["config_sha256"] == sha and reloaded["plan"]["unchanged"] == ["keep"]
                servers = daemon.wait(daemon.all_ready, 60, "both READY")
                if servers["keep"]["pid"] != keep_pid:
                    raise SystemExit(f"reload {i + 1}: the unchanged server's pid changed")
                cold_starts.append(ready["startup_s"])
                latencies.append(timestamp(ready) - saved_at - ready["startup_s"])
                detect.append(timestamp(reloaded) - saved_at)
                stops.append(timestamp(stopped) - timestamp(stopping))

            daemon.wait(daemon.all_ready, 60, "both READY before idling")
            cpu0, wall0 = cpu_seconds(daemon.proc.pid), time.monotonic()
            time.sleep(idle_s)  # the measurement itself: nothing may happen during it
            cpu1, wall1 = cpu_seconds(daemon.proc.pid), time.monotonic()
            idle_percent = 100 * (cpu1 - cpu0) / (wall1 - wall0)
            final = daemon.servers()
        finally:
            daemon.proc.send_signal(signal.SIGTERM)
            code = daemon.proc.wait(120)

    quantiles = statistics.quantiles(latencies, n=10) if len(latencies) >= 2 else latencies * 9
    print(
        "veloxd daemon benchmark (real `veloxd run`, real workers on the tiny model, "
        f"{os.cpu_count()} CPU cores, {sys.platform})"
    )
    print(f"  reload latency (save -> changed server READY, minus its cold start), {reloads} reloads:")
    print(
        f"    median {statistics.median(latencies):.3f} s, p90 {quantiles[8]:.3f} s, max {max(latencies):.3f} s"
        f"  (target < 1 s: {'met' if max(latencies) < 1 else 'MISSED'} at max)"
    )
    print(
        f"    of which save -> config_reloaded (watch + debounce + validate): median {statistics.median(detect):.3f} s"
    )
    print(f"    of which stopping the old worker (SIGTERM -> exit): median {statistics.median(stops):.3f} s")
    print(f"    worker cold start subtracted: median {statistics.median(cold_starts):.3f} s")
    print(
        f"  daemon CPU while idle with 2 READY servers over {wall1 - wall0:.1f} s: {idle_percent:.3f} % of one core "
        f"({cpu1 - cpu0:.2f} CPU s; target < 1 %: {'met' if idle_percent < 1 else 'MISSED'})"
    )
    print(
        f"  unchanged server kept pid {keep_pid} across all {reloads} reloads: "
        f"{'yes' if final['keep']['pid'] == keep_pid else 'NO'} (checked after every reload)"
    )
    print(f"  daemon exit code after SIGTERM: {code}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
