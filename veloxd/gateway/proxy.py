"""Forwarding one request to its worker over loopback HTTP; streams pass through chunk by chunk.

The worker (mlx_lm's HTTP/1.0 server) ends a stream by closing the connection, so a worker that
dies mid-stream looks like a normal end of body: a stream without its `data: [DONE]` line is
therefore reported to the client as an error event (the openai package raises APIError).
A client that disconnects cancels the handler (handler_cancellation), which closes the upstream
connection: the worker stops generating for it. A worker that stops sending (hung, stopped)
costs a request one of the gateway's upstream timeouts: 504 naming it, or, once a stream has
begun, an SSE error event naming it (upstream.Timeouts).
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from veloxd.gateway import upstream
from veloxd.gateway.events import RequestRecord
from veloxd.gateway.sse import SseReader
from veloxd.gateway.upstream import (
    DEFAULT_TIMEOUTS,
    Timeouts,
    UpstreamBroken,
    UpstreamLost,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from veloxd.openai_errors import openai_error

PASSED_REQUEST_HEADERS = ("Content-Type", "Accept")

__all__ = ["Timeouts", "UpstreamLost", "UpstreamTimeout", "UpstreamUnreachable", "error_response", "forward"]


def upstream_headers(request: web.Request, token: str | None) -> dict[str, str]:
    headers = {h: request.headers[h] for h in PASSED_REQUEST_HEADERS if h in request.headers}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


async def forward(
    request: web.Request,
    host: str,
    port: int,
    body: bytes,
    token: str | None,
    record: RequestRecord,
    spares: upstream.Spares | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> web.StreamResponse:
    """The worker's answer to `body`; raises UpstreamUnreachable / UpstreamLost before any answer.

    A timeout before the answer has begun is a 504 naming the setting that ran out.
    """
    try:
        answer = await upstream.post(host, port, request.path, body, upstream_headers(request, token), spares, timeouts)
    except UpstreamTimeout as err:
        return timeout_response(record, err)
    try:
        record.status = answer.status
        headers = {"Content-Type": answer.content_type} if answer.content_type else {}
        if answer.content_type.startswith("text/event-stream"):
            return await _stream(request, answer, headers, record)
        try:
            data = await answer.read()
        except UpstreamTimeout as err:
            return timeout_response(record, err)
        except (UpstreamBroken, ConnectionError) as err:
            record.status, record.error = 502, f"upstream: {err!r}"
            return error_response(
                502, f"the server for '{record.server}' failed mid-answer ({err!r})", "upstream_failed"
            )
        record.first_byte_s = _since(record)
        _count_tokens(data, record)
        return web.Response(body=data, status=answer.status, headers=headers)
    finally:
        answer.close()


async def _stream(
    request: web.Request, answer: upstream.Upstream, headers: dict[str, str], record: RequestRecord
) -> web.StreamResponse:
    record.stream = True
    response = web.StreamResponse(status=answer.status, headers={**headers, "Cache-Control": "no-cache"})
    await response.prepare(request)
    events = SseReader()
    code = "upstream_failed"
    try:
        async for chunk in answer.chunks():
            if record.first_byte_s is None:
                record.first_byte_s = _since(record)
            try:
                await response.write(chunk)
            except ConnectionError:  # the client left: leaving closes the upstream request too
                record.status, record.error = 499, "client disconnected"
                return response
            events.feed(chunk)
            if events.done:  # the answer is whole: a client that closes now (openai does) is no disconnect
                record.answered = True
                break
    except UpstreamTimeout as err:
        record.error, code = f"upstream: {err}", "upstream_timeout"
    except (UpstreamBroken, ConnectionError) as err:
        record.error = f"upstream: {err!r}"
    _count_usage(events.usage, record)
    if not events.done:
        record.error = record.error or "the server closed the stream before [DONE] (it exited or was killed)"
        record.status = 504 if code == "upstream_timeout" else 502
        error = openai_error(
            record.status, f"the server for '{record.server}' stopped mid-stream: {record.error}", code
        )
        try:
            await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
        except ConnectionError:
            return response
    try:
        await response.write_eof()
    except ConnectionError:
        if not record.answered:
            record.status, record.error = 499, "client disconnected"
    return response


def error_response(
    status: int, message: str, code: str, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    """An OpenAI-shaped error (veloxd.openai_errors) with this status."""
    return web.json_response(openai_error(status, message, code, **extra), status=status, headers=headers)


def timeout_response(record: RequestRecord, err: UpstreamTimeout) -> web.Response:
    """504: the worker did not answer in time (it may be hung; the daemon's health checks decide)."""
    record.status, record.error = 504, f"upstream: {err}"
    return error_response(
        504,
        f"the server for '{record.server}' timed out: {err}",
        "upstream_timeout",
        timeout=f"gateway.{err.key}",
        timeout_s=err.seconds,
        server=record.server,
    )


def _since(record: RequestRecord) -> float:
    return time.monotonic() - record.started


def _count_tokens(data: bytes, record: RequestRecord) -> None:
    if b'"usage"' not in data:
        return
    try:
        usage = json.loads(data).get("usage")
    except (ValueError, AttributeError):
        return
    _count_usage(usage, record)


def _count_usage(usage: Any, record: RequestRecord) -> None:
    if isinstance(usage, dict):
        record.tokens_in = usage.get("prompt_tokens", record.tokens_in)
        record.tokens_out = usage.get("completion_tokens", record.tokens_out)
