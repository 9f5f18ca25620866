"""A minimal HTTP/1.1 client for the gateway's one kind of upstream: a worker on loopback.

The workers are mlx_lm's `http.server` handlers: one request per connection, answered as
HTTP/1.0 (the body ends with Content-Length, or when the worker closes the connection).
aiohttp's general client costs several times the CPU of this per request (measured with
`make bench-gateway`), and per-request CPU is the gateway's added latency on a busy Mac.
Chunked bodies are decoded too, so a worker that changes its framing still works.
Every wait on the worker is bounded (`Timeouts`: connect, first byte, each gap between reads):
a hung worker costs a request its timeout, never the client's patience.
A request is sent at most once: a connection that breaks after the request went out is
`UpstreamLost`, never a reason to send it again (the worker may have been generating for it).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
READ_SIZE = 65536
MAX_HEADER_BYTES = 65536
SPARE_CONNECT_S = 10.0


class UpstreamUnreachable(Exception):
    """Nothing was sent to the worker (connection refused): safe to wait for it and retry."""


class UpstreamLost(Exception):
    """The connection broke after the request was sent, before any answer: the worker may have
    died while generating for it, or reset it alive. Not safe to send again."""


class UpstreamBroken(Exception):
    """The answer was cut short or malformed."""


class UpstreamTimeout(Exception):
    """A bounded wait on the worker ran out; `key` is the gateway setting that bounds it."""

    def __init__(self, key: str, seconds: float, waiting_for: str) -> None:
        super().__init__(f"no {waiting_for} from the worker within gateway.{key} ({seconds:g} s)")
        self.key, self.seconds = key, seconds


@dataclass(frozen=True)
class Timeouts:
    """The gateway's waits on a worker, in seconds (the `gateway:` keys of the same names)."""

    connect_timeout_s: float = 10.0
    first_byte_timeout_s: float = 600.0
    read_timeout_s: float = 120.0


DEFAULT_TIMEOUTS = Timeouts()


async def _bounded(awaitable: Awaitable[T], seconds: float, key: str, waiting_for: str) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise UpstreamTimeout(key, seconds, waiting_for) from None


@dataclass
class Upstream:
    """An answer whose status and headers are read; its body is read with `read()` or `chunks()`."""

    status: int
    headers: Mapping[str, str]  # lower-case names
    _reader: asyncio.StreamReader
    _writer: asyncio.StreamWriter
    timeouts: Timeouts = field(default_factory=Timeouts)

    def _read(self, awaitable: Awaitable[T]) -> Awaitable[T]:
        return _bounded(awaitable, self.timeouts.read_timeout_s, "read_timeout_s", "further bytes")

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked framing removed)."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            async for chunk in self._dechunk():
                yield chunk
            return
        remaining = int(self.headers["content-length"]) if "content-length" in self.headers else None
        while remaining is None or remaining > 0:
            data = await self._read(self._reader.read(READ_SIZE if remaining is None else min(READ_SIZE, remaining)))
            if not data:
                if remaining:
                    raise UpstreamBroken(f"the body ended {remaining} bytes short")
                return
            if remaining is not None:
                remaining -= len(data)
            yield data

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def _dechunk(self) -> AsyncIterator[bytes]:
        try:
            while True:
                size = int((await self._read(self._reader.readline())).split(b";")[0].strip() or b"x", 16)
                if size == 0:
                    return
                yield await self._read(self._reader.readexactly(size))
                await self._read(self._reader.readexactly(2))
        except (ValueError, asyncio.IncompleteReadError) as err:
            raise UpstreamBroken(f"malformed chunked body: {err!r}") from None

    def close(self) -> None:
        """Closing the connection is how a worker learns that nobody wants the rest."""
        self._writer.close()


class Spares:
    """Connections opened ahead of need, per worker: a request does not wait for connect and accept.

    The worker answers one request per connection, so each request takes a spare (if a live one
    is there) and a background task opens the next. A spare the worker closed meanwhile (it was
    restarted or stopped) is noticed before use or, at the latest, when it answers nothing.
    """

    def __init__(self, per_worker: int = 2) -> None:
        self.per_worker = per_worker
        self._idle: dict[tuple[str, int], list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._opening: dict[tuple[str, int], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def take(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A spare the worker has not closed, or None. Checked before use, since a request sent on
        it is never sent again: a spare that then turns out closed costs the request a 502."""
        idle = self._idle.get((host, port), [])
        while idle:
            reader, writer = idle.pop()
            if not reader.at_eof() and not writer.is_closing() and _quiet(writer):
                return reader, writer
            writer.close()
        return None

    def refill(self, host: str, port: int) -> None:
        key = (host, port)
        missing = self.per_worker - len(self._idle.get(key, [])) - self._opening.get(key, 0)
        for _ in range(max(0, missing)):
            self._opening[key] = self._opening.get(key, 0) + 1
            task = asyncio.ensure_future(self._open(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _open(self, key: tuple[str, int]) -> None:
        try:
            async with asyncio.timeout(SPARE_CONNECT_S):  # a worker whose backlog is full: give up, not hang
                pair = await asyncio.open_connection(*key, limit=MAX_HEADER_BYTES)
        except (OSError, TimeoutError):
            return  # the worker is not listening (stopped, restarting): the next request connects itself
        finally:
            self._opening[key] -= 1
        self._idle.setdefault(key, []).append(pair)

    def close(self) -> None:
        for idle in self._idle.values():
            for _, writer in idle:
                writer.close()
        self._idle.clear()


def _quiet(writer: asyncio.StreamWriter) -> bool:
    """Nothing to read on an unused connection: the worker has not closed or reset it.

    Asks the socket, not the stream: the kernel may hold a close the event loop has not read yet.
    """
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()  # not select.select: the gateway's descriptors may be above FD_SETSIZE
    poller.register(sock.fileno(), select.POLLIN)
    return not poller.poll(0)


async def post(
    host: str,
    port: int,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    spares: Spares | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> Upstream:
    """Send one POST and read the answer's status line and headers (on a spare connection if there is one).

    Raises UpstreamUnreachable when no connection could be made (nothing was sent), UpstreamLost
    when the connection broke after the request was sent: the caller must not send it again.
    """
    spare = spares.take(host, port) if spares is not None else None
    if spares is not None:
        spares.refill(host, port)
    if spare is None:
        try:
            spare = await _bounded(
                asyncio.open_connection(host, port, limit=MAX_HEADER_BYTES),
                timeouts.connect_timeout_s,
                "connect_timeout_s",
                "connection",
            )
        except OSError as err:
            raise UpstreamUnreachable(f"{host}:{port}: {err.strerror or err}") from None
    return await _exchange(*spare, host, port, path, body, headers, timeouts)


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host: str,
    port: int,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    timeouts: Timeouts,
) -> Upstream:
    try:
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        status_line = await _bounded(
            reader.readline(), timeouts.first_byte_timeout_s, "first_byte_timeout_s", "first byte"
        )
        if not status_line:
            raise UpstreamLost("the worker closed the connection without answering")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise UpstreamBroken(f"not an HTTP status line: {status_line[:80]!r}")
        answer: dict[str, str] = {}
        gap = timeouts.read_timeout_s
        while (line := await _bounded(reader.readline(), gap, "read_timeout_s", "header line")) not in (b"\r\n", b"\n"):
            if not line:
                raise UpstreamLost("the worker closed the connection in the middle of its headers")
            name, _, value = line.decode("latin-1").partition(":")
            answer[name.strip().lower()] = value.strip()
        return Upstream(int(parts[1]), answer, reader, writer, timeouts)
    except (ConnectionError, asyncio.IncompleteReadError) as err:
        writer.close()
        raise UpstreamLost(repr(err)) from None
    except (asyncio.LimitOverrunError, ValueError) as err:
        writer.close()
        raise UpstreamBroken(f"malformed answer: {err!r}") from None
    except BaseException:
        writer.close()
        raise
