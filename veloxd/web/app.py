"""The dashboard's routes, installable into any aiohttp Application (the `veloxd web` process, a gateway).

    GET  /                          the dashboard page (static HTML/CSS/JS shipped in the package)
    GET  /api/state                 servers, daemon, chart history, whether actions are enabled
    GET  /api/logs?server=&q=&limit= recent log events, filtered
    GET  /api/stream                server-sent events: `state` each sample, `logs` as events arrive
    POST /api/reload                re-read veloxd.yaml (bearer token)
    POST /api/servers/{name}/restart  restart one server (bearer token)
    GET  /metrics                   Prometheus text format

Reads are open (the page binds loopback only); every request must name an allowed Host (a
DNS-rebinding page cannot read the logs). Actions need the bearer token in an Authorization
header, which a cross-site form cannot send and a cross-site script cannot send without a CORS
preflight this app never grants; an Origin other than the dashboard's own addresses is refused
as well. "Own" is the configured listen address and the loopback names, never the request's Host
header: a DNS-rebinding page sends a Host and an Origin that agree (both evil.example).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from veloxd.daemon.control import DaemonUnreachable
from veloxd.web.metrics import GatewayCounters, exposition, registry_for
from veloxd.web.monitor import Monitor

STATIC = Path(__file__).resolve().parent / "static"
KEEPALIVE_S = 15.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(
    app: web.Application,
    monitor: Monitor,
    *,
    api_key: str | Callable[[], str | None] | None = None,
    allowed_hosts: Iterable[str] | None = None,
    allowed_origins: Iterable[str] | None = None,
    gateway: GatewayCounters | None = None,
    prefix: str = "",
    key_setting: str = "dashboard.api_key_env",
    server_actions: Mapping[str, Callable[[str], Awaitable[dict[str, Any]]]] | None = None,
) -> None:
    """Install the dashboard into `app`, and start/stop `monitor` with it.

    Long: the route table and its small handlers, which share the monitor, the key and the
    Host/Origin rule of this mount; each handler is a few lines.

    Args:
        api_key: the bearer token for actions, or a function returning it at each request (a
            gateway's token changes on reload); None: read-only (actions answer 403).
        allowed_hosts: accepted Host headers (e.g. "127.0.0.1:8090"); None: any (the caller checks).
        allowed_origins: Origins accepted on actions (e.g. "http://127.0.0.1:8090"); None: those of
            allowed_hosts, or no Origin at all when both are None (a request without one still passes).
        gateway: the gateway's admission/unload/request counters, for /metrics.
        prefix: mount point, e.g. "/dashboard" (the page uses relative URLs).
        key_setting: the veloxd.yaml key that enables actions, named when they are refused.
        server_actions: more per-server actions, POST /api/servers/{name}/{action} (a gateway's
            start and unload of on-demand servers), each answering {"ok": ..., ...}.
    """
    hosts = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None
    origins = {o.lower() for o in allowed_origins} if allowed_origins is not None else None
    if origins is None:
        origins = {f"http://{h}" for h in hosts} if hosts is not None else set()
    registry = registry_for(monitor, gateway)
    current_key: Callable[[], str | None] = api_key if callable(api_key) else (lambda: api_key)
    extra = dict(server_actions or {})

    def guard(handler: Handler, action: bool = False) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if hosts is not None and request.host.lower() not in hosts:
                return _error(421, f"unexpected Host header {request.host!r}")
            if action:
                refused = _refuse_action(request, current_key(), origins, key_setting)
                if refused is not None:
                    return refused
            return await handler(request)

        return guarded

    async def index(request: web.Request) -> web.StreamResponse:
        if not request.path.endswith("/"):  # relative URLs in the page need the trailing slash
            raise web.HTTPFound(request.path + "/")
        return web.FileResponse(STATIC / "index.html", headers=_no_cache())

    async def state(request: web.Request) -> web.StreamResponse:
        await monitor.refresh(max_age_s=monitor.interval_s)
        return web.json_response(
            {
                **monitor.page_state(),
                "history": list(monitor.history),
                "actions": current_key() is not None,
                "actions_setting": key_setting,
                "server_actions": ["restart", *extra],
                "interval_s": monitor.interval_s,
                "history_max": monitor.history.maxlen,
            },
            headers=_no_cache(),
        )

    async def logs(request: web.Request) -> web.StreamResponse:
        query = request.query
        try:
            limit = int(query.get("limit", "500"))
        except ValueError:
            return _error(400, "limit must be an integer")
        events = monitor.log_tail(query.get("server") or None, query.get("q") or None, limit)
        return web.json_response({"events": events}, headers=_no_cache())

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **_no_cache()})
        await response.prepare(request)
        queue = monitor.subscribe()
        try:
            await response.write(b"retry: 2000\n\n")
            while True:
                try:
                    kind, data = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if kind == "close":
                    break
                await response.write(f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n".encode())
        except (ConnectionResetError, RuntimeError):
            pass  # the page went away
        finally:
            monitor.unsubscribe(queue)
        return response

    async def metrics(request: web.Request) -> web.StreamResponse:
        await monitor.refresh(max_age_s=min(monitor.interval_s, 1.0))
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def reload(request: web.Request) -> web.StreamResponse:
        return await _forward(monitor, {"command": "reload"})

    async def restart(request: web.Request) -> web.StreamResponse:
        return await _forward(monitor, {"command": "restart", "name": request.match_info["name"]})

    def server_action(act: Callable[[str], Awaitable[dict[str, Any]]]) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            answer = await act(request.match_info["name"])
            await monitor.refresh()
            return web.json_response(answer, status=200 if answer.get("ok") else 409)

        return handle

    routes = [
        web.get(prefix + "/", guard(index)),
        web.get(prefix + "/api/state", guard(state)),
        web.get(prefix + "/api/logs", guard(logs)),
        web.get(prefix + "/api/stream", guard(stream)),
        web.get(prefix + "/metrics", guard(metrics)),
        web.post(prefix + "/api/reload", guard(reload, action=True)),
        web.post(prefix + "/api/servers/{name}/restart", guard(restart, action=True)),
        *(
            web.post(f"{prefix}/api/servers/{{name}}/{a}", guard(server_action(f), action=True))
            for a, f in extra.items()
        ),
    ]
    for name in ("app.js", "style.css"):
        routes.append(web.get(f"{prefix}/static/{name}", guard(_static(name))))
    app.add_routes(routes)

    async def start(_: web.Application) -> None:
        await monitor.start()

    async def stop(_: web.Application) -> None:
        await monitor.close()  # also ends the live streams, so shutdown does not wait on them

    app.on_startup.append(start)
    app.on_shutdown.append(stop)


def _static(name: str) -> Handler:
    async def serve(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / name, headers=_no_cache())

    return serve


def _refuse_action(
    request: web.Request, api_key: str | None, origins: set[str], key_setting: str
) -> web.Response | None:
    if api_key is None:
        return _error(403, f"actions are disabled: set {key_setting} in veloxd.yaml to enable them")
    scheme, _, supplied = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":  # the scheme is case-insensitive (RFC 9110), as on /v1
        supplied = ""
    if not hmac.compare_digest(supplied.strip().encode(), api_key.encode()):
        return _error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
    origin = request.headers.get("Origin")
    if origin is not None and origin.lower() not in origins:
        return _error(403, f"cross-origin request from {origin} refused")
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return _error(403, "cross-site request refused")
    return None


async def _forward(monitor: Monitor, payload: dict[str, Any]) -> web.Response:
    try:
        answer = await monitor.client.ask(payload)
    except DaemonUnreachable as err:
        return _error(503, str(err))
    await monitor.refresh()
    return web.json_response(answer, status=200 if answer.get("ok") else 409)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=status, headers=headers)


def _no_cache() -> dict[str, str]:
    return {"Cache-Control": "no-store"}
