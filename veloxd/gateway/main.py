"""`veloxd gateway`: the gateway process the daemon supervises (never started by hand).

Connects to the daemon's control socket (VELOXD_CONTROL_SOCKET), binds host:port, prints the
READY line the supervisor waits for, serves until SIGTERM/SIGINT or until the daemon's lifeline
closes. Besides /v1 it serves the dashboard and /metrics (veloxd.gateway.dashboard), sampling the
daemon over the same socket. Exit codes (veloxd.protocol.ExitCode): 0 stopped, 2 started by hand
(no control socket), 3 no daemon to talk to, 4 the port cannot be bound (the daemon waits for it,
as for a worker's).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from veloxd import lifeline
from veloxd.config.sections import Dashboard
from veloxd.daemon.client import DaemonClient
from veloxd.daemon.control import DaemonUnreachable
from veloxd.gateway.app import build_app
from veloxd.gateway.connections import GatewayRunner, accept_failures
from veloxd.gateway.fleet import Fleet
from veloxd.gateway.idle import unload_when_idle
from veloxd.gateway.limits import ConnectionLimits
from veloxd.protocol import (
    CONTROL_SOCKET_ENV,
    READY_SCHEMA_VERSION,
    ExitCode,
    ReadyPayload,
    format_ready,
)
from veloxd.web.monitor import Monitor

FIRST_VIEW_TIMEOUT_S = 30.0


async def serve(host: str, port: int, socket_path: str, lifeline_fd: int | None) -> int:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(accept_failures())
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if lifeline_fd is not None:
        lifeline.stop_on_eof(lifeline_fd, stop, "veloxd gateway")
    daemon = DaemonClient(socket=Path(socket_path))  # one client: the fleet's and the dashboard's
    fleet = Fleet(daemon)
    try:
        await asyncio.wait_for(fleet.refresh(), FIRST_VIEW_TIMEOUT_S)
    except (TimeoutError, DaemonUnreachable) as err:
        print(f"veloxd gateway: error: {err}", file=sys.stderr, flush=True)
        return ExitCode.FAILED
    sampling = Dashboard()  # the `dashboard:` block's defaults (the block itself is for the sidecar only)
    monitor = Monitor(daemon, sampling.interval_s, sampling.history)
    app = build_app(fleet, monitor=monitor, host=host, port=port)
    runner = GatewayRunner(app, lambda: ConnectionLimits.of(fleet.settings), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as err:
        print(f"veloxd gateway: error: cannot bind {host}:{port} ({err.strerror or err})", file=sys.stderr, flush=True)
        await runner.cleanup()
        return ExitCode.PORT_IN_USE
    tasks = [asyncio.create_task(fleet.follow_view()), asyncio.create_task(unload_when_idle(fleet))]
    shown = f"[{host}]" if ":" in host else host
    payload: ReadyPayload = {
        "schema_version": READY_SCHEMA_VERSION,
        "model": "-",
        "method": "gateway",
        "host": host,
        "port": port,
        "pid": os.getpid(),
        "endpoints": {
            "openai_base_url": f"http://{shown}:{port}/v1",
            "dashboard": f"http://{shown}:{port}/",
            "metrics": f"http://{shown}:{port}/metrics",
        },
        "servers": sorted(fleet.servers),
    }
    print(format_ready(payload), flush=True)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await runner.cleanup()
    return ExitCode.OK


def run(host: str, port: int, lifeline_fd: int | None) -> int:
    socket_path = os.environ.get(CONTROL_SOCKET_ENV)
    if not socket_path:
        print(
            f"veloxd gateway: error: {CONTROL_SOCKET_ENV} is not set (the daemon starts the gateway)", file=sys.stderr
        )
        return ExitCode.INVALID
    return asyncio.run(serve(host, port, socket_path, lifeline_fd))
