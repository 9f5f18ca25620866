"""`veloxd web`: the dashboard process the daemon runs for a `dashboard:` block (internal command).

It speaks the worker protocol, so the daemon supervises it like a server: it binds its port,
prints `VELOXD_READY {json}`, answers GET /health, stops on SIGTERM/SIGINT, and exits when the
daemon's lifeline pipe closes. Exit codes (veloxd.protocol.ExitCode): 0 stopped, 2 invalid input,
4 the port cannot be bound (the daemon waits for it, as for a worker's).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from veloxd import lifeline
from veloxd.protocol import READY_SCHEMA_VERSION, ExitCode, ReadyPayload, format_ready
from veloxd.web.app import add_routes
from veloxd.web.monitor import DaemonClient, Monitor


@dataclass(frozen=True)
class WebOptions:
    state_dir: Path
    host: str
    port: int
    interval_s: float
    history: int
    api_key_env: str | None = None
    lifeline_fd: int | None = None


def allowed_hosts(host: str, port: int) -> set[str]:
    """Host headers a browser on this machine sends for the dashboard's address."""
    names = {host, "127.0.0.1", "localhost", "[::1]"}
    return {f"{name}:{port}" for name in names} | ({f"[{host}]:{port}"} if ":" in host else set())


def build_app(options: WebOptions, api_key: str | None) -> web.Application:
    app = web.Application()
    monitor = Monitor(DaemonClient(options.state_dir), options.interval_s, options.history)
    add_routes(app, monitor, api_key=api_key, allowed_hosts=allowed_hosts(options.host, options.port))

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    return app


async def serve(options: WebOptions) -> int:
    api_key = None
    if options.api_key_env:
        api_key = os.environ.get(options.api_key_env)
        if not api_key:
            print(
                f"veloxd web: error: --api-key-env {options.api_key_env}: the variable is unset or empty",
                file=sys.stderr,
                flush=True,
            )
            return ExitCode.INVALID
    runner = web.AppRunner(build_app(options, api_key), handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, options.host, options.port).start()
    except OSError as err:
        print(
            f"veloxd web: error: cannot bind {options.host}:{options.port} ({err.strerror or err})",
            file=sys.stderr,
            flush=True,
        )
        await runner.cleanup()
        return ExitCode.PORT_IN_USE
    shown = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{shown}:{options.port}/"
    payload: ReadyPayload = {
        "schema_version": READY_SCHEMA_VERSION,
        "pid": os.getpid(),
        "host": options.host,
        "port": options.port,
        "endpoints": {"dashboard": url, "metrics": url + "metrics", "health": url + "health"},
        "actions": api_key is not None,
    }
    print(format_ready(payload), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if options.lifeline_fd is not None:
        lifeline.stop_on_eof(options.lifeline_fd, stop, "veloxd web")
    await stop.wait()
    await runner.cleanup()
    return ExitCode.OK


def main(options: WebOptions) -> int:
    return asyncio.run(serve(options))
