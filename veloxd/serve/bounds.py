"""Per-request bounds that need no mlx: header and body time, body size and form, and noticing a client that left.

The HTTP handler (veloxd/serve/mlx_compat/handler.py) calls these; they speak only sockets and files.
"""

from __future__ import annotations

import io
import json
import select
import socket
import time
from io import BufferedIOBase
from typing import Any

PEER_CHECK_EVERY_S = 0.25  # how often a waiting handler looks at its client's socket
READ_CHUNK = 64 * 1024


class BodyRefused(Exception):
    """The request body cannot be accepted: `status` (400/408/413) and a message for the client."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class ClientGone(Exception):
    """The client closed its connection before the body arrived: nothing to answer."""


class RequestCancelled(Exception):
    """Generation for this request was stopped (`reason`: client_disconnected, shutdown)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PromptTooLong(ValueError):
    """A prompt over limits.max_prompt_tokens; the message names both numbers."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"prompt is {tokens} tokens; this server accepts at most {limit} (limits.max_prompt_tokens)")
        self.tokens, self.limit = tokens, limit


def read_body(
    rfile: BufferedIOBase,
    sock: socket.socket,
    length_header: str | None,
    *,
    max_bytes: int,
    timeout_s: float,
    idle_timeout_s: float | None,
) -> bytes | None:
    """The whole body, read within `timeout_s` in total (not per read), or BodyRefused.

    None when there is no usable Content-Length: the caller leaves that to mlx_lm (411/400).
    """
    if length_header is None:
        return None
    try:
        length = int(length_header)
    except ValueError:
        return None
    if length < 0:
        raise BodyRefused(400, f"Content-Length {length} is negative", "invalid_request_error")
    if length > max_bytes:
        raise BodyRefused(
            413,
            f"request body of {length} bytes exceeds this server's limit of {max_bytes} bytes (limits.max_body_bytes)",
            "request_too_large",
        )
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    remaining = length
    try:
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = rfile.read1(min(remaining, READ_CHUNK))
            if not chunk:
                raise ClientGone
            chunks.append(chunk)
            remaining -= len(chunk)
    except TimeoutError:
        raise BodyRefused(
            408,
            f"request body not received within {timeout_s:g} s ({length - remaining} of "
            f"{length} bytes arrived; limits.request_body_timeout_s)",
            "request_timeout",
        ) from None
    finally:
        sock.settimeout(idle_timeout_s)
    return b"".join(chunks)


def peer_closed(sock: socket.socket) -> bool:
    """True when the client has closed its end (EOF or reset); never blocks."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):  # reset, or the socket is already closed
        return True


class RequestWatch:
    """One in-flight request: its client socket, its generation context once known, why it was cut short."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.ctx: Any = None  # mlx_lm's GenerationContext; ctx.stop() ends its generation
        self.reason: str | None = None
        self.tokens = 0
        self._checked = 0.0

    def cancel(self, reason: str) -> None:
        """Stop generating for this request (from any thread); the first reason sticks."""
        if self.reason is None:
            self.reason = reason
        if self.ctx is not None:
            self.ctx.stop()

    def client_gone(self) -> bool:
        """Look at the socket at most every PEER_CHECK_EVERY_S (a cheap non-blocking peek)."""
        now = time.monotonic()
        if now - self._checked < PEER_CHECK_EVERY_S:
            return False
        self._checked = now
        return peer_closed(self.sock)


class HeaderDeadline(io.RawIOBase):
    """The connection's reader with a total deadline while a request line and headers arrive.

    The socket timeout alone restarts with every byte, so a client sending a byte a second holds
    a handler thread forever; while `deadline` is set, each read waits at most what is left of it
    and a read after it raises TimeoutError (http.server then drops the connection). Each read is
    one `readinto1` of the socket's own buffered file: at most one recv.
    """

    def __init__(self, inner: io.BufferedReader, sock: socket.socket) -> None:
        super().__init__()
        self._inner, self._sock = inner, sock
        self.deadline: float | None = None
        self.expired = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.expired = True
                raise TimeoutError("request headers not received in time")
            self._sock.settimeout(left)
        try:
            return self._inner.readinto1(buffer)
        except TimeoutError:
            self.expired = self.deadline is not None
            raise

    def close(self) -> None:
        self._inner.close()
        super().close()


def client_gone_error(err: BaseException | None) -> bool:
    """A write or read failed because the client went away (or stalled past a timeout): not our fault."""
    return isinstance(err, (ConnectionError, TimeoutError))


def check_json_body(body: bytes) -> dict[str, Any]:
    """The request body's JSON object, or BodyRefused(400) naming what is wrong with it: not UTF-8,
    not JSON, not an object, or a string holding a lone surrogate (valid JSON, but no tokenizer
    can encode it)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BodyRefused(
            400,
            f"request body is not UTF-8: byte 0x{body[err.start]:02x} at offset {err.start}",
            "invalid_request_error",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BodyRefused(400, f"request body is not valid JSON: {err}", "invalid_request_error") from None
    if not isinstance(data, dict):
        raise BodyRefused(
            400, f"request body must be a JSON object, got {type(data).__name__}", "invalid_request_error"
        )
    where = lone_surrogate(data, "")
    if where is not None:
        raise BodyRefused(
            400, f"{where} holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape)", "invalid_request_error"
        )
    return data


def lone_surrogate(value: Any, path: str) -> str | None:
    """The JSON path of the first string (key or value) that cannot be encoded as UTF-8, if any."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "the body"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if lone_surrogate(key, "") is not None:
                    return f"a key of {where or 'the body'}"
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None
