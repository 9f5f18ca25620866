"""`make run`: the daemon on configs/veloxd.yaml (the shipped tiny model, no download).

Starts `veloxd run` in the foreground with its log and state under .cache/, waits until the
gateway and every `start: always` server are READY (on-demand ones stopped, waiting for their
first request), prints a curl line per entry and an openai example against the gateway, each
naming its entry as "model", and forwards Ctrl-C / SIGTERM. A closed terminal (SIGHUP) ends
the demo too: the daemon is told to stop, not left running on the demo's ports (to the daemon
itself SIGHUP means reload); under nohup, where SIGHUP is ignored, the demo keeps running. A demo
killed outright (SIGKILL) takes the daemon along through `--lifeline-fd`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from veloxd.daemon.exitcodes import server_settled
from veloxd.daemon.statefile import read_state

REPO = Path(__file__).resolve().parent.parent
GATEWAY = "@gateway"  # the gateway's name among the state file's processes (config.gateway.GATEWAY_NAME)
PROMPT = "Write a Python function that adds two numbers."


def entries(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state's server entries (by name), without the gateway."""
    return {n: s for n, s in (state.get("servers") or {}).items() if n != GATEWAY}


def base_url(state: dict[str, Any], name: str | None = None) -> str:
    """The OpenAI base URL of the gateway (no name) or of one server's own port."""
    process = (state.get("servers") or {})[name or GATEWAY]
    return f"http://{process['host']}:{process['port']}/v1"


def curl_lines(state: dict[str, Any]) -> list[str]:
    """One paste-ready request per entry, by name through the gateway (each worker's port without one)."""
    gateway = GATEWAY in (state.get("servers") or {})
    lines = []
    for name, server in entries(state).items():
        body = json.dumps(
            {"model": name, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48},
        )
        url = base_url(state, None if gateway else name)
        note = "started by this request (on demand)" if server.get("start") == "on_demand" else "running"
        lines.append(
            f"# {name}: {server['method']}, {note}\n"
            f"curl -s {url}/chat/completions -H 'Content-Type: application/json' -d '{body}'"
        )
    return lines


def openai_snippet(base: str, model: str) -> str:
    """Five lines (ruff-formatted) that work as printed against the demo's gateway (no token on loopback)."""
    return (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base}", api_key="unused")  # the demo needs no token\n'
        f'reply = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Say hi"}}])\n'
        'print(reply.model, "->", reply.choices[0].message.content)\n'
        "print([m.id for m in client.models.list()])\n"
    )


def settled(state: dict[str, Any] | None) -> bool:
    """The gateway and every `always` server ready; on-demand ones ready or stopped (not yet asked for)."""
    servers = (state or {}).get("servers") or {}
    return bool(servers) and all(server_settled(s) for s in servers.values())


def wait_ready(proc: subprocess.Popen, state_dir: Path, timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        state = read_state(state_dir)
        if settled(state):
            return state
        time.sleep(0.2)
    return None


def ready_text(state: dict[str, Any], state_dir: Path) -> str:
    """What the demo prints once it is up: requests by entry name, the openai example, where to look."""
    out = ["", "veloxd demo: ready. Try:", "", *curl_lines(state)]
    names = [n for n, s in entries(state).items() if s.get("start") != "on_demand"]
    if GATEWAY in (state.get("servers") or {}) and names:
        base = base_url(state)
        out += ["", "# Python (pip install openai):", openai_snippet(base, names[0])]
        out.append(f"Dashboard: {base[: -len('/v1')]}/  (metrics: /metrics)")
    dashboard = state.get("dashboard") or {}
    if dashboard.get("port"):
        out.append(f"Dashboard: http://{dashboard['host']}:{dashboard['port']}/  (metrics: /metrics)")
    out.append(f"Status: .venv/bin/veloxd status --state-dir {state_dir}   Stop: Ctrl-C")
    return "\n".join(out) + "\n"


def not_ready_text(state: dict[str, Any] | None, log: Path) -> str:
    """Which servers are not ready after the wait, and why, as status shows it (a port held by
    another process, a missing model), instead of only pointing at the log."""
    lines = [f"veloxd demo: servers are not all ready yet; see {log}"]
    for name, server in ((state or {}).get("servers") or {}).items():
        if server_settled(server):
            continue
        why = (
            server.get("held_reason")
            or server.get("waiting_reason")
            or server.get("fatal_reason")
            or server.get("last_error")
        )
        lines.append(f"  {name}: {server['state']}" + (f": {why}" if why else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m veloxd.demo")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "veloxd.yaml")
    parser.add_argument("--ready-timeout", type=float, default=300)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache", help="the daemon's log and state")
    args = parser.parse_args(argv)
    cache = args.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
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
    # The daemon's lifeline: only this process holds the write end, so however the demo dies (even
    # SIGKILL) the daemon sees EOF and stops, instead of staying on the demo's ports.
    lifeline, keep = os.pipe()
    proc = subprocess.Popen([*command, "--lifeline-fd", str(lifeline)], pass_fds=(lifeline,))
    os.close(lifeline)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, _f: proc.send_signal(s))
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # ignored: started under nohup
        signal.signal(signal.SIGHUP, lambda _s, _f: proc.send_signal(signal.SIGTERM))
    state = wait_ready(proc, state_dir, args.ready_timeout)
    if state is not None:
        print(ready_text(state, state_dir), flush=True)
    elif proc.poll() is None:
        print(not_ready_text(read_state(state_dir), cache / "veloxd.jsonl"), flush=True)
    code = proc.wait()
    os.close(keep)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
