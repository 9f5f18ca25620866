"""Forwarding one request to its worker over loopback HTTP; streams pass through chunk by chunk.

The worker (mlx_lm's HTTP/1.0 server) ends a stream by closing the connection, so a worker that
dies mid-stream looks like a normal end of body: a stream without its `data: [DONE]` line is
therefore reported to the client as an error event (the openai package raises APIError).
A client that disconnects cancels the handler (handler_cancellation), which closes the upstream
connection: the worker stops generating for it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from veloxd.gateway import upstream
from veloxd.gateway.events import RequestRecord
from veloxd.gateway.upstream import UpstreamBroken, UpstreamLost, UpstreamUnreachable

PASSED_REQUEST_HEADERS = ("Content-Type", "Accept")
DONE = b"data: [DONE]"

__all__ = ["UpstreamLost", "UpstreamUnreachable", "error_response", "forward"]


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
) -> web.StreamResponse:
    """The worker's answer to `body`; raises UpstreamUnreachable / UpstreamLost before any answer."""
    answer = await upstream.post(host, port, request.path, body, upstream_headers(request, token), spares)
    try:
        record.status = answer.status
        headers = {"Content-Type": answer.content_type} if answer.content_type else {}
        if answer.content_type.startswith("text/event-stream"):
            return await _stream(request, answer, headers, record)
        try:
            data = await answer.read()
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
    finished = False
    tail = b""
    try:
        async for chunk in answer.chunks():
            if record.first_byte_s is None:
                record.first_byte_s = _since(record)
            try:
                await response.write(chunk)
            except ConnectionError:  # the client left: leaving closes the upstream request too
                record.status, record.error = 499, "client disconnected"
                return response
            if b'"usage"' in chunk or DONE in chunk:
                window = tail + chunk
                finished = DONE in window
                _count_stream_usage(window, record)
                if finished:  # the answer is whole: a client that closes now (openai does) is no disconnect
                    record.answered = True
                    break
            tail = chunk[-64:]
    except (UpstreamBroken, ConnectionError) as err:
        record.error = f"upstream: {err!r}"
    if not finished:
        record.error = record.error or "the server closed the stream before [DONE] (it exited or was killed)"
        record.status = 502
        error = {
            "error": {
                "message": f"the server for '{record.server}' stopped mid-stream: {record.error}",
                "type": "server_error",
                "code": "upstream_failed",
            }
        }
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
    """An OpenAI-shaped error: {"error": {"message", "type", "code", ...}}."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "code": code, **extra}}
    return web.json_response(body, status=status, headers=headers)


def _since(record: RequestRecord) -> float:
    return time.monotonic() - record.started


def _count_tokens(data: bytes, record: RequestRecord) -> None:
    if b'"usage"' not in data:
        return
    try:
        usage = json.loads(data).get("usage") or {}
    except (ValueError, AttributeError):
        return
    record.tokens_in, record.tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")


def _count_stream_usage(window: bytes, record: RequestRecord) -> None:
    """Read `usage` from the SSE event that carries it (mlx_lm sends it with include_usage)."""
    for line in window.split(b"\n"):
        if b'"usage"' in line and line.startswith(b"data: {"):
            try:
                usage = json.loads(line[6:]).get("usage") or {}
            except ValueError:
                continue
            record.tokens_in = usage.get("prompt_tokens", record.tokens_in)
            record.tokens_out = usage.get("completion_tokens", record.tokens_out)
