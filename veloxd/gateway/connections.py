"""The gateway's client connections: a deadline for the first request, a cap, and quiet failures.

aiohttp closes an idle keep-alive connection (keepalive_timeout) but gives a new connection no
deadline of its own; so `GuardedServer` closes one that has not sent complete headers within
gateway.header_timeout_s, and marks connections beyond gateway.max_connections, whose requests
app.py answers with 503. Malformed requests get aiohttp's 400 with one debug event, not a
traceback; running out of file descriptors in the accept loop is one event per period with a
count (`accept_failures`), not a traceback per retry. Both throttled events summarise, so a
flood of clients cannot flood the daemon's log.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from veloxd.gateway.events import emit
from veloxd.gateway.limits import ConnectionLimits, Throttle

REPORT_EVERY_S = 10.0
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
OVER_CAP = web.AppKey("over_cap", set)  # the handlers of connections beyond max_connections


class GatewayHandler(RequestHandler):
    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):  # a client's malformed request: its 400 says why
            emit("gateway_malformed_request_refused", "debug", error=f"{type(exc).__name__}: {exc.message}"[:200])
            return
        super().log_exception(*args, **kw)  # a bug of ours: keep the traceback


class GuardedServer(web.Server):
    def __init__(self, plain: web.Server, limits: Callable[[], ConnectionLimits], over_cap: set[Any]) -> None:
        # aiohttp's Server keeps its handler arguments in _kwargs (3.9 to 3.14): reused as they are.
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
        self._limits = limits
        self.over_cap = over_cap
        self._deadlines: dict[RequestHandler, asyncio.TimerHandle] = {}
        self.timed_out = Throttle(REPORT_EVERY_S, time.monotonic)
        making = self.request_factory

        def first_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
            deadline = self._deadlines.pop(protocol, None)
            if deadline is not None:
                deadline.cancel()
            return making(message, payload, protocol, writer, task)

        self.request_factory = first_request

    def __call__(self) -> RequestHandler:
        self._kwargs["keepalive_timeout"] = self._limits().keepalive_timeout_s  # live: read per connection
        return GatewayHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        limits = self._limits()
        if len(self._connections) > limits.max_connections:
            self.over_cap.add(handler)
        self._deadlines[handler] = self._loop.call_later(limits.header_timeout_s, self._too_slow, handler)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.over_cap.discard(handler)
        deadline = self._deadlines.pop(handler, None)
        if deadline is not None:
            deadline.cancel()

    def _too_slow(self, handler: RequestHandler) -> None:
        self._deadlines.pop(handler, None)
        transport = self._connections.get(handler)
        if transport is None:
            return
        transport.close()
        count = self.timed_out.note()
        if count:
            seconds = self._limits().header_timeout_s
            emit("gateway_connections_timed_out", "info", count=count, total=self.timed_out.total, timeout_s=seconds)


class GatewayRunner(web.AppRunner):
    """An AppRunner whose server is a GuardedServer with the gateway's live limits."""

    def __init__(self, app: web.Application, limits: Callable[[], ConnectionLimits], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return GuardedServer(plain, self._limits, self._app[OVER_CAP])


def accept_failures(clock: Callable[[], float] = time.monotonic) -> Callable[[asyncio.AbstractEventLoop, dict], None]:
    """An event-loop exception handler: out-of-descriptors on accept is a throttled event, the rest as usual."""
    throttle = Throttle(REPORT_EVERY_S, clock)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCES and "accept" in context.get("message", "")):
            loop.default_exception_handler(context)
            return
        count = throttle.note()
        if count:  # asyncio retries the accept after a second by itself
            emit("gateway_accept_failed", "warning", count=count, total=throttle.total, error=exc.strerror)

    return handle
