"""The dashboard and /metrics on the gateway's port, and who may reach them there.

With a `gateway:` block the gateway is the one place that serves the page, its JSON and SSE
endpoints and /metrics (the `dashboard:` sidecar is not run: veloxd check refuses the block),
so a user sees one dashboard with the gateway's own counters next to the daemon's and workers'.

The gateway may bind a LAN address, but the page shows logs and states; so:
- from this machine (a loopback peer naming the gateway's own loopback Host), reads are open, as
  `veloxd status` is for the local user and as Prometheus on the same Mac expects;
- from anywhere else, or with a foreign Host (a DNS-rebinding page), they need the gateway's
  bearer token like /v1, and without gateway.api_key_env they are refused;
- actions (restart, reload, and here start / unload of an on-demand server) always need the
  gateway's bearer token in an Authorization header and, when the request names an Origin, one
  of the gateway's own addresses (veloxd.web.app checks both; never against the request's Host).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from aiohttp import web

from veloxd.daemon.control import DaemonUnreachable
from veloxd.daemon.state import ServerState
from veloxd.gateway.fleet import Fleet, Unavailable
from veloxd.gateway.proxy import error_response
from veloxd.web.app import add_routes
from veloxd.web.main import allowed_hosts
from veloxd.web.monitor import Monitor

OWN_HOSTS = web.AppKey("dashboard_hosts", frozenset)
PREFIXES = ("/api/", "/static/")
PAGES = ("/", "/metrics")


def mount(app: web.Application, monitor: Monitor, fleet: Fleet, host: str, port: int) -> None:
    """Install the dashboard routes (veloxd.web.app) with the fleet's counters and the gateway's token."""
    app[OWN_HOSTS] = frozenset(h.lower() for h in allowed_hosts(host, port))
    # Actions' Origin must be one of these addresses, never whatever the request's Host says.
    origins = {f"http://{h}" for h in app[OWN_HOSTS]}

    def token() -> str | None:  # read per request: gateway.api_key_env applies on reload, without a restart
        variable = fleet.settings.get("api_key_env")
        return (os.environ.get(variable) or None) if variable else None

    async def start(name: str) -> dict[str, Any]:
        return await start_now(fleet, name)

    async def unload(name: str) -> dict[str, Any]:
        return await unload_now(fleet, name)

    add_routes(
        app,
        monitor,
        api_key=token,
        allowed_origins=origins,
        gateway=fleet.tally,
        key_setting="gateway.api_key_env",
        server_actions={"start": start, "unload": unload},
    )


def _on_demand(fleet: Fleet, name: str) -> dict[str, Any] | None:
    """Why `name` cannot be started or unloaded by hand (None: it can)."""
    server = fleet.servers.get(name)
    if server is None:
        return {"ok": False, "error": f"no server named {name!r} (servers: {', '.join(fleet.servers) or 'none'})"}
    if server.get("start") != "on_demand":
        return {"ok": False, "error": f"server {name!r} has start: always: the daemon runs it (restart it instead)"}
    return None


async def start_now(fleet: Fleet, name: str) -> dict[str, Any]:
    """The page's start: admission and start, as a first request would do, without waiting for ready."""
    # The page follows the daemon's state stream, which can be ahead of the gateway's view
    # (a click on start right after an unload): decide on a fresh view, never a stale one.
    try:
        await fleet.refresh()
    except DaemonUnreachable as err:
        return {"ok": False, "error": str(err)}
    refused = _on_demand(fleet, name)
    if refused is not None:
        return refused
    state = fleet.servers[name]["state"]
    if state not in (ServerState.STOPPED.value, ServerState.STOPPING.value) or fleet.start_pending(name):
        return {"ok": True, "state": state, "already": True}
    fleet.slot(name).last_used = fleet.clock()  # idle_unload_s counts from this start, as from a request
    try:
        answer = await fleet.admit_and_start(name)
    except Unavailable as err:  # over the memory budget: the same numbers a request's 503 carries
        return {"ok": False, "error": str(err), **err.facts}
    except DaemonUnreachable as err:
        return {"ok": False, "error": str(err)}
    # `already`: the gateway's view was behind the daemon's (a start was under way or done).
    return {"ok": True, "state": ServerState.STARTING.value, "already": bool(answer.get("already"))}


async def unload_now(fleet: Fleet, name: str) -> dict[str, Any]:
    """The page's unload: stop an idle on-demand server now (one with requests is left alone)."""
    refused = _on_demand(fleet, name)
    if refused is not None:
        return refused
    slot = fleet.slot(name)
    if slot.in_flight:
        return {"ok": False, "error": f"server {name!r} has {slot.in_flight} request(s) in flight or queued"}
    slot.unloading = True  # the idle poller must not ask for the same stop
    try:
        answer = await fleet.daemon.unload(name, "manual")
    except DaemonUnreachable as err:
        slot.unloading = False
        return {"ok": False, "error": str(err)}
    if answer.get("ok") and not answer.get("already"):
        fleet.tally.unloaded(name, "manual")
    return answer


def is_dashboard(request: web.Request) -> bool:
    return OWN_HOSTS in request.app and (request.path in PAGES or request.path.startswith(PREFIXES))


def _loopback_peer(request: web.Request) -> bool:
    try:
        address = ipaddress.ip_address((request.remote or "").split("%")[0])
    except ValueError:
        return False  # a unix socket or an unknown transport: not known to be this machine
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def open_to(request: web.Request) -> bool:
    """A read from this machine, addressed to the gateway by its own name: no token needed."""
    return _loopback_peer(request) and request.host.lower() in request.app[OWN_HOSTS]


def refuse(request: web.Request, variable: str | None) -> web.Response | None:
    """The refusal of a dashboard request that is not open and cannot be authenticated; None otherwise."""
    if open_to(request) or variable:
        return None  # open, or the gateway's bearer check decides
    if _loopback_peer(request):
        return error_response(421, f"unexpected Host header {request.host!r}", "misdirected_request")
    return error_response(
        403,
        "the dashboard and /metrics answer requests from this machine only; "
        "set gateway.api_key_env to reach them from elsewhere with the bearer token",
        "forbidden",
    )
