"""The gateway's aiohttp application: auth, routing by `model`, waiting for readiness, forwarding.

`build_app` makes the whole application in one place: the OpenAI routes and, given a Monitor,
the dashboard and /metrics (veloxd.web.app) on the same port, under the access rules of
veloxd.gateway.dashboard. `Accounting.listen` sees every finished request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from veloxd.endpoints import connect_host
from veloxd.gateway import dashboard, model_ref
from veloxd.gateway.connections import OVER_CAP
from veloxd.gateway.events import CLIENT_DISCONNECTED, Accounting, RequestRecord
from veloxd.gateway.fleet import Fleet, Unavailable
from veloxd.gateway.limits import CLIENT_WRITE_TIMEOUT_S, setting, upstream_timeouts
from veloxd.gateway.proxy import UpstreamUnreachable, error_response, forward, send_whole
from veloxd.gateway.upstream import Spares
from veloxd.web.monitor import Monitor

FORWARDED_PATHS = ("/v1/chat/completions", "/v1/completions", "/chat/completions")  # what mlx_lm serves
OPEN_PATHS = ("/health",)
CLIENT_MAX_SIZE = 2**31  # aiohttp's own cap; the live gateway.max_body_bytes is checked per request
RETRY_PAUSE_S = 0.05

FLEET = web.AppKey("fleet", Fleet)
ACCOUNTING = web.AppKey("accounting", Accounting)
CREATED = web.AppKey("created", int)
SPARES = web.AppKey("spares", Spares)
WRITE_TIMEOUT = web.AppKey("write_timeout_s", float)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(
    fleet: Fleet,
    accounting: Accounting | None = None,
    monitor: Monitor | None = None,
    *,
    host: str,
    port: int,
    write_timeout_s: float = CLIENT_WRITE_TIMEOUT_S,
) -> web.Application:
    """The gateway on host:port; with `monitor`, also the dashboard and /metrics (veloxd.web.app).

    `write_timeout_s` bounds each write to a client (veloxd.gateway.proxy).
    """
    app = web.Application(client_max_size=CLIENT_MAX_SIZE, middlewares=[_capped, _auth, _openai_shaped])
    app[OVER_CAP] = set()  # filled by connections.GuardedServer
    app[FLEET] = fleet
    app[ACCOUNTING] = accounting or Accounting()
    app[ACCOUNTING].listen(fleet.tally.finished)
    app[CREATED] = int(time.time())
    app[SPARES] = Spares()
    app[WRITE_TIMEOUT] = write_timeout_s
    app.on_cleanup.append(_close_spares)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    for path in FORWARDED_PATHS:
        app.router.add_post(path, completion)
    if monitor is not None:
        dashboard.mount(app, monitor, fleet, host, port)
    return app


async def _close_spares(app: web.Application) -> None:
    app[SPARES].close()


@web.middleware
async def _capped(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A connection beyond gateway.max_connections gets 503 (and is closed), whatever it asks."""
    if request.protocol not in request.app[OVER_CAP]:
        return await handler(request)
    limit = setting(request.app[FLEET].settings, "max_connections")
    response = error_response(
        503,
        f"the gateway has more open connections than gateway.max_connections ({limit}); retry shortly",
        "too_many_connections",
        headers={"Retry-After": "1"},
    )
    response.force_close()
    return response


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bearer auth (scheme case-insensitive) when gateway.api_key_env is set; /health stays open."""
    variable = request.app[FLEET].settings.get("api_key_env")
    if request.path in OPEN_PATHS:
        return await handler(request)
    if dashboard.is_dashboard(request):
        refused = dashboard.refuse(request, variable)
        if refused is not None:
            return refused
        if dashboard.open_to(request):  # a browser or Prometheus on this machine: no token for reads
            return await handler(request)
    if not variable:
        return await handler(request)
    expected = os.environ.get(variable)
    if not expected:
        return error_response(
            503,
            f"gateway.api_key_env names {variable}, which is not set in the daemon's "
            "environment: every request is refused until it is",
            "gateway_misconfigured",
        )
    scheme, _, supplied = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(supplied.strip().encode(), expected.encode()):
        return await handler(request)
    return error_response(
        401, "missing or wrong bearer token", "invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
    )


@web.middleware
async def _openai_shaped(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (an unknown path, a wrong method) in OpenAI's error shape, not text/plain."""
    try:
        return await handler(request)
    except web.HTTPException as refused:
        if refused.status < 400:
            raise
        kept = {name: value for name, value in refused.headers.items() if name.lower() == "allow"}
        message = f"{refused.reason}: {request.method} {request.path}"
        return error_response(refused.status, message, refused.reason.lower().replace(" ", "_"), headers=kept)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _model_card(app: web.Application, name: str, server: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": app[CREATED],
        "owned_by": "veloxd",
        "state": server["state"],
        "start": server["start"],
        "aliases": server["aliases"],
        "model": server["model"],
        "method": server["method"],
        "need_bytes": server.get("need"),
    }


async def list_models(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    data = [_model_card(request.app, name, server) for name, server in fleet.servers.items()]
    return web.json_response({"object": "list", "data": data, "memory_budget_bytes": fleet.view.get("budget")})


async def get_model(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = model_ref.resolve(fleet, request.match_info["model"])
    if isinstance(name, web.Response):
        return name
    return web.json_response(_model_card(request.app, name, fleet.servers[name]))


async def _read_body(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it is longer than `limit` (checked before and while reading)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    parts, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def completion(request: web.Request) -> web.StreamResponse:
    record = RequestRecord(method=request.method, path=request.path)
    try:
        response = await _complete(request, record)
        record.status = record.status if record.status and record.error else response.status
        if not response.prepared:  # send it now: the accounting below is not on the client's clock
            await send_whole(request, response, record, request.app[WRITE_TIMEOUT])
        return response
    except asyncio.CancelledError:  # the client went away (handler_cancellation): upstream is closed too
        if not record.answered and record.cancelled is None:
            record.status, record.error, record.cancelled = 499, "client disconnected", CLIENT_DISCONNECTED
        raise
    finally:
        request.app[ACCOUNTING].finish(record)


async def _complete(request: web.Request, record: RequestRecord) -> web.StreamResponse:
    fleet = request.app[FLEET]
    limit = int(setting(fleet.settings, "max_body_bytes"))
    body_timeout_s = float(setting(fleet.settings, "body_timeout_s"))
    try:
        async with asyncio.timeout(body_timeout_s):
            body = await _read_body(request, limit)
    except TimeoutError:
        response = error_response(
            408,
            f"the request body did not arrive within gateway.body_timeout_s ({body_timeout_s:g} s)",
            "request_timeout",
            timeout="gateway.body_timeout_s",
        )
        response.force_close()  # the rest of the body is not worth waiting for
        return response
    if body is None:
        return error_response(
            413, f"request body larger than gateway.max_body_bytes ({limit} bytes)", "request_too_large"
        )
    try:
        payload = json.loads(body)
    except ValueError as err:
        return error_response(400, f"request body is not JSON: {err}", "invalid_json")
    model = model_ref.requested_model(fleet, payload)
    if isinstance(model, web.Response):
        return model
    record.model, record.stream = model, bool(payload.get("stream"))
    name = model_ref.resolve(fleet, model)
    if isinstance(name, web.Response):
        return name
    record.server = name
    if model != name:  # the worker knows its entry name (--served-name); aliases live only here
        payload["model"] = name
        body = json.dumps(payload).encode()
    slot = fleet.slot(name)
    slot.in_flight += 1
    try:
        return await _forward_when_ready(request, fleet, name, body, record)
    except Unavailable as err:
        headers = {"Retry-After": str(err.retry_after_s)} if err.retry_after_s else None
        record.error = str(err)
        return error_response(503, str(err), "server_unavailable", headers=headers, **err.facts)
    finally:
        fleet.release(slot)


async def _forward_when_ready(
    request: web.Request, fleet: Fleet, name: str, body: bytes, record: RequestRecord
) -> web.StreamResponse:
    deadline = fleet.clock() + fleet.start_timeout_s()
    slot = fleet.slot(name)
    while True:
        await fleet.ensure_ready(name, deadline)
        async with slot.semaphore:
            record.queued_s = time.monotonic() - record.started
            slot.forwarding += 1
            try:
                answer = await _forward_to(request, fleet, name, body, record)
            finally:
                slot.forwarding -= 1
            if answer is not None:
                return answer
        if fleet.clock() >= deadline:
            raise Unavailable(f"server '{name}' is not reachable", retry_after_s=5)
        await asyncio.sleep(RETRY_PAUSE_S)


async def _forward_to(
    request: web.Request, fleet: Fleet, name: str, body: bytes, record: RequestRecord
) -> web.StreamResponse | None:
    """The worker's answer, an error response, or None when nothing could be sent to the worker (it
    is gone: a retry may reach its successor). Once the request was sent it is never sent again: a
    worker that dies before answering is a 502 (veloxd.gateway.proxy)."""
    server = fleet.servers.get(name)
    if server is None:
        raise Unavailable(f"server '{name}' was removed from the config")
    try:
        return await forward(
            request,
            connect_host(server["host"]),
            server["port"],
            body,
            server.get("upstream_token"),
            record,
            request.app[SPARES],
            upstream_timeouts(fleet.settings),
            request.app[WRITE_TIMEOUT],
        )
    except UpstreamUnreachable:
        fleet.mark_unreachable(name)  # died or unloaded since the last view: wait for it again
    return None
