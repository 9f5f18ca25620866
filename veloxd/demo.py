"""`make run`: the daemon on configs/veloxd.yaml (the shipped tiny model, no download).

Starts `veloxd run` in the foreground with its log and state under .cache/, waits until every
server is READY, prints a ready-to-paste curl line per server, and forwards Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from veloxd.daemon.statefile import read_state

REPO = Path(__file__).resolve().parent.parent


def curl_lines(state: dict) -> list[str]:
    lines = []
    for name, server in sorted(state.get("servers", {}).items()):
        host = server["host"]
        body = json.dumps(
            {
                "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
                "max_tokens": 48,
            }
        )
        lines.append(
            f"# {name}: {server['method']} on port {server['port']}\n"
            f"curl -s http://{host}:{server['port']}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"
        )
    return lines


def wait_ready(proc: subprocess.Popen, state_dir: Path, timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        state = read_state(state_dir)
        servers = (state or {}).get("servers") or {}
        if servers and all(s["state"] == "ready" for s in servers.values()):
            return state
        time.sleep(0.2)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m veloxd.demo")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "veloxd.yaml")
    parser.add_argument("--ready-timeout", type=float, default=300)
    args = parser.parse_args(argv)
    cache = REPO / ".cache"
    cache.mkdir(exist_ok=True)
    state_dir = cache / "state"
    command = [
        sys.executable,
        "-m",
        "veloxd",
        "run",
        "--config",
        str(args.config),
        "--log-file",
        str(cache / "veloxd.jsonl"),
        "--state-dir",
        str(state_dir),
    ]
    print("veloxd demo: " + " ".join(command[1:]), flush=True)
    proc = subprocess.Popen(command)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, _f: proc.send_signal(s))
    state = wait_ready(proc, state_dir, args.ready_timeout)
    if state is not None:
        print("\nveloxd demo: every server is ready. Try:\n", flush=True)
        print("\n".join(curl_lines(state)), flush=True)
        dashboard = (read_state(state_dir) or {}).get("dashboard") or {}
        if dashboard.get("port"):
            print(f"\nDashboard: http://{dashboard['host']}:{dashboard['port']}/  (metrics: /metrics)", flush=True)
        print(f"\nStatus: .venv/bin/veloxd status --state-dir {state_dir}   Stop: Ctrl-C\n", flush=True)
    elif proc.poll() is None:
        print("veloxd demo: servers are not all ready yet; see .cache/veloxd.jsonl", flush=True)
    return proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
