"""`make bench-gateway`: what the gateway costs, measured side by side with the worker it fronts.

One real `veloxd run` with a gateway, one always-on server (the shipped tiny model, fp16) and one
on-demand server. Every figure is measured in one run, direct-to-worker and through-gateway
requests interleaved (A B A B ...) so machine noise hits both sides alike:

  latency     = wall time of a short completion (1 token, not streamed), p50 and p99
  first token = time from sending a streamed completion to its first `data:` event with text
  throughput  = completion tokens per second with 1 and with 4 concurrent clients (32 tokens each):
                many short rounds, each a direct and a gateway burst back to back (order alternating);
                the means are shown, the change is the median of the per-round gateway/direct ratios
  cold start  = first request to a stopped on-demand server through the gateway (start + load +
                answer) next to that worker's own cold start (`startup_s`: spawn -> READY + /health)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.system.daemon import REPO, spawn_daemon
from testkit.ports import free_port
from testkit.process import cpu_seconds

MODEL = REPO / "veloxd" / "assets" / "tiny-llama"
LOAD_S = 300


def post(port: int, body: dict[str, Any], first_token: bool = False) -> tuple[float, int]:
    """(seconds, completion tokens); with first_token, seconds until the first streamed text."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=LOAD_S)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
        if not first_token:
            usage = json.loads(response.read())["usage"]
            return time.perf_counter() - started, int(usage["completion_tokens"])
        for line in response:
            if line.startswith(b"data: {") and b'"text": ""' not in line:
                elapsed = time.perf_counter() - started
                response.read()
                return elapsed, 1
        raise RuntimeError("the stream ended without text")
    finally:
        conn.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def interleaved(ports: dict[str, int], n: int, call: Callable[[int], float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {side: [] for side in ports}
    for i in range(n):
        order = list(ports.items()) if i % 2 == 0 else list(reversed(ports.items()))
        for side, port in order:
            out[side].append(call(port))
    return out


def throughput(port: int, clients: int, per_client: int, model: str) -> float:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}

    def worker(_: int) -> int:
        return sum(post(port, body)[1] for _ in range(per_client))

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(worker, range(clients)))
    return tokens / (time.perf_counter() - started)


class Daemon:
    def __init__(self, root: Path, gateway_port: int, direct_port: int) -> None:
        self.root = root
        self.log = root / "veloxd.jsonl"
        self.config = root / "veloxd.yaml"
        entry = {"model": str(MODEL), "method": "fp16", "ready_timeout_s": LOAD_S}
        servers = {"alpha": {**entry, "port": direct_port}, "lazy": {**entry, "start": "on_demand", "idle_unload_s": 1}}
        lines = ["version: 1", f"gateway: {json.dumps({'port': gateway_port})}", "servers:"]
        lines += [f"  {name}: {json.dumps(body)}" for name, body in servers.items()]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc = spawn_daemon(self.config, self.log, root / "state")

    def events(self, event: str, **match: Any) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        records = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in records if r["event"] == event and all(r.get(k) == v for k, v in match.items())]

    def wait(self, event: str, count: int = 1, **match: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + LOAD_S
        while len(found := self.events(event, **match)) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"no {event} {match} (daemon exit {self.proc.poll()}); see {self.log}")
            time.sleep(0.1)
        return found

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run(args: argparse.Namespace) -> dict[str, Any]:
    gateway, direct = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="veloxd-bench-gw-") as tmp:
        daemon = Daemon(Path(tmp), gateway, direct)
        try:
            daemon.wait("server_ready", server="alpha")
            daemon.wait("server_ready", server="@gateway")
            ports = {"direct": direct, "gateway": gateway}
            short = {"model": "alpha", "prompt": "Hi", "max_tokens": 1, "temperature": 0}
            interleaved(ports, 10, lambda p: post(p, short)[0])  # warm both paths (prompt cache, pools)
            gateway_pid = daemon.wait("server_ready", server="@gateway")[0]["pid"]
            cpu_before = cpu_seconds(gateway_pid)
            latency = interleaved(ports, args.requests, lambda p: post(p, short)[0])
            gateway_cpu = (cpu_seconds(gateway_pid) - cpu_before) / args.requests
            stream = {**short, "max_tokens": 8, "stream": True}
            ttft = interleaved(ports, args.requests // 4, lambda p: post(p, stream, first_token=True)[0])
            # Many short rounds, sides alternating (A B, then B A): drift in the machine's load hits both.
            rates: dict[str, dict[int, list[float]]] = {side: {1: [], 4: []} for side in ports}
            for i in range(args.rounds):
                for clients in (1, 4):
                    order = list(ports.items()) if i % 2 == 0 else list(reversed(ports.items()))
                    for side, port in order:
                        rates[side][clients].append(throughput(port, clients, args.per_client, "alpha"))
            cold = []
            for i in range(args.cold_starts):
                if i:
                    daemon.wait("server_stopped", count=i, server="lazy")
                seconds, _ = post(gateway, {"model": "lazy", "prompt": "Hi", "max_tokens": 1})
                worker = daemon.wait("server_ready", count=i + 1, server="lazy")[i]["startup_s"]
                cold.append((seconds, worker))
        finally:
            daemon.stop()
    return {
        "latency": latency,
        "ttft": ttft,
        "rates": rates,
        "cold": cold,
        "requests": args.requests,
        "gateway_cpu_s_per_request": gateway_cpu,
        "load_average": os.getloadavg(),
    }


def report(result: dict[str, Any]) -> str:
    lat, ttft, rates = result["latency"], result["ttft"], result["rates"]
    ms = 1000.0
    lines = [
        f"gateway vs direct-to-worker (tiny-llama fp16, {result['requests']} interleaved requests per side)",
        "",
        f"{'':34}{'direct':>12}{'gateway':>12}{'added':>12}",
    ]

    def row(label: str, a: float, b: float, unit: str = "ms", scale: float = ms) -> None:
        lines.append(
            f"{label:34}{a * scale:>10.2f}{unit:>2}{b * scale:>10.2f}{unit:>2}{(b - a) * scale:>+10.2f}{unit:>2}"
        )

    row("short completion p50", statistics.median(lat["direct"]), statistics.median(lat["gateway"]))
    row("short completion p99", percentile(lat["direct"], 0.99), percentile(lat["gateway"], 0.99))
    row("time to first streamed token p50", statistics.median(ttft["direct"]), statistics.median(ttft["gateway"]))
    for clients in (1, 4):
        direct, gateway = rates["direct"][clients], rates["gateway"][clients]
        ratios = [g / d for d, g in zip(direct, gateway)]  # adjacent rounds: the same load, ideally
        low, _, high = statistics.quantiles(ratios, n=4)
        lines.append(
            f"{f'throughput, {clients} client(s), tokens/s':34}{statistics.mean(direct):>12.1f}"
            f"{statistics.mean(gateway):>12.1f}{(statistics.median(ratios) - 1) * 100:>+11.1f}%"
            f"  (per-round ratio IQR {low:.2f}-{high:.2f})"
        )
    for seconds, worker in result["cold"]:
        lines.append(
            f"{'cold start: worker alone / on-demand':34}{worker * ms:>10.0f}ms{seconds * ms:>10.0f}ms"
            f"{(seconds - worker) * ms:>+10.0f}ms"
        )
    lines.append(f"{'gateway CPU per short completion':34}{'':12}{result['gateway_cpu_s_per_request'] * ms:>10.2f}ms")
    load = ", ".join(f"{x:.1f}" for x in result["load_average"])
    lines += [
        "",
        f"load average during the run: {load} on {os.cpu_count()} CPUs (a busy machine adds scheduling "
        "delay to every extra process hop)",
    ]
    lines += [
        "targets: < 5 ms added p50 latency, < 3 % throughput loss; on-demand cold start = the worker's "
        "own cold start + the first (1-token) completion + gateway polling"
    ]
    return "\n".join(lines)


def _int_keys(d: dict[str, Any]) -> dict[Any, Any]:
    return {int(k) if k.isdigit() else k: v for k, v in d.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="short completions per side (default 200)")
    parser.add_argument("--rounds", type=int, default=30, help="throughput rounds per side and client count")
    parser.add_argument("--per-client", type=int, default=1, help="completions per client in a throughput round")
    parser.add_argument("--cold-starts", type=int, default=2, help="on-demand cold starts measured")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--report", type=Path, metavar="JSON", help="print the report of an earlier --json run")
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(args.report.read_text(), object_hook=_int_keys)))
        return 0
    result = run(args)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
