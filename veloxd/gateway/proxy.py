"""Forwarding one request to its worker over loopback HTTP; streams pass through chunk by chunk.

The worker (mlx_lm's HTTP/1.0 server) ends a stream by closing the connection, so a worker that
dies mid-stream looks like a normal end of body: a stream without its `data: [DONE]` line is
therefore reported to the client as an error event (the openai package raises APIError).
A client that disconnects cancels the handler (handler_cancellation), which closes the upstream
connection: the worker stops generating for it. A worker that stops sending (hung, stopped)
costs a request one of the gateway's upstream timeouts: 504 naming it, or, once a stream has
begun, an SSE error event naming it (upstream.Timeouts). A worker that dies after the request
was sent, before answering, is a 502 naming the server: the request is never sent again (the
worker may have generated part of the answer). A client that stops reading a stream (its
connection open) stalls each write: after CLIENT_WRITE_TIMEOUT_S the gateway gives up on it,
closes both connections (the worker stops generating) and records it cancelled (client_stalled).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from veloxd.gateway import upstream
from veloxd.gateway.events import CLIENT_DISCONNECTED, CLIENT_STALLED, RequestRecord
from veloxd.gateway.limits import CLIENT_WRITE_TIMEOUT_S
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

__all__ = ["Timeouts", "UpstreamTimeout", "UpstreamUnreachable", "error_response", "forward", "send_whole"]


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
    write_timeout_s: float = CLIENT_WRITE_TIMEOUT_S,
) -> web.StreamResponse:
    """The worker's answer to `body`; raises UpstreamUnreachable when nothing could be sent.

    A timeout before the answer has begun is a 504 naming the setting that ran out; a connection
    that broke after the request was sent is a 502 naming the server (never sent again).
    """
    try:
        answer = await upstream.post(host, port, request.path, body, upstream_headers(request, token), spares, timeouts)
    except UpstreamTimeout as err:
        return timeout_response(record, err)
    except UpstreamLost as err:
        return failed_response(record, f"closed the connection before answering ({err})", err)
    except UpstreamBroken as err:
        return failed_response(record, f"sent a malformed answer ({err})", err)
    try:
        record.status = answer.status
        headers = {"Content-Type": answer.content_type} if answer.content_type else {}
        if answer.content_type.startswith("text/event-stream"):
            return await _stream(request, answer, headers, record, write_timeout_s)
        try:
            data = await answer.read()
        except UpstreamTimeout as err:
            return timeout_response(record, err)
        except (UpstreamBroken, ConnectionError) as err:
            return failed_response(record, f"failed mid-answer ({err!r})", err)
        record.first_byte_s = _since(record)
        _count_tokens(data, record)
        return web.Response(body=data, status=answer.status, headers=headers)
    finally:
        answer.close()  # when the client left or stalled too: the worker stops generating


async def _stream(
    request: web.Request,
    answer: upstream.Upstream,
    headers: dict[str, str],
    record: RequestRecord,
    write_timeout_s: float,
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
            lost = await _write(response, chunk, write_timeout_s)
            if lost:  # leaving closes the upstream request too
                return _give_up(request, response, record, lost, write_timeout_s)
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
        lost = await _write(response, b"data: " + json.dumps(error).encode() + b"\n\n", write_timeout_s)
        if lost:  # the upstream failure stays the request's status
            return _give_up(request, response, record, lost, write_timeout_s, keep_status=True)
    lost = await _write(response, None, write_timeout_s)
    if lost and not record.answered:
        return _give_up(request, response, record, lost, write_timeout_s)
    if lost == CLIENT_STALLED:  # after the whole answer: nothing to record, only the connection to drop
        _drop(request)
    return response


async def send_whole(
    request: web.Request, response: web.StreamResponse, record: RequestRecord, write_timeout_s: float
) -> None:
    """Send a response not yet sent (a whole answer, an error), each write bounded like a stream's."""
    try:
        async with asyncio.timeout(write_timeout_s):
            await response.prepare(request)
            await response.write_eof()
    except TimeoutError:
        _give_up(request, response, record, CLIENT_STALLED, write_timeout_s)


async def _write(response: web.StreamResponse, data: bytes | None, write_timeout_s: float) -> str | None:
    """Write `data` (None: the end of the body) to the client: None, or why the client is lost.

    aiohttp's write waits without bound for a client that stopped reading (a full socket buffer);
    the wait is bounded here.
    """
    try:
        async with asyncio.timeout(write_timeout_s):
            if data is None:
                await response.write_eof()
            else:
                await response.write(data)
    except ConnectionError:
        return CLIENT_DISCONNECTED
    except TimeoutError:
        return CLIENT_STALLED
    return None


def _give_up(
    request: web.Request,
    response: web.StreamResponse,
    record: RequestRecord,
    reason: str,
    write_timeout_s: float,
    keep_status: bool = False,
) -> web.StreamResponse:
    """The client left or stalled: record why; a stalled client's connection is dropped, unsent bytes with it."""
    record.cancelled = reason
    if not keep_status:
        record.status = 499
        record.error = (
            "client disconnected"
            if reason == CLIENT_DISCONNECTED
            else f"the client read nothing for {write_timeout_s:g} s (CLIENT_WRITE_TIMEOUT_S)"
        )
    if reason == CLIENT_STALLED:
        _drop(request)
    return response


def _drop(request: web.Request) -> None:
    """Close a stalled client's connection at once, unsent bytes discarded: aiohttp's own end of the
    response would wait on it again, without bound."""
    if request.transport is not None:
        request.transport.abort()


def error_response(
    status: int, message: str, code: str, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    """An OpenAI-shaped error (veloxd.openai_errors) with this status."""
    return web.json_response(openai_error(status, message, code, **extra), status=status, headers=headers)


def failed_response(record: RequestRecord, what: str, err: Exception) -> web.Response:
    """502: the worker's connection broke or its answer was malformed; the request is not sent again."""
    record.status, record.error = 502, f"upstream: {err!r}"
    return error_response(502, f"the server for '{record.server}' {what}", "upstream_failed", server=record.server)


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
