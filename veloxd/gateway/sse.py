"""Reading a worker's server-sent events as they pass through: whole `data:` lines, however chunked.

TCP hands the gateway arbitrary slices of the stream, so an event can arrive in pieces; the
reader keeps the unfinished last line until its end arrives. Only what accounting needs is
parsed (the `usage` object, the `[DONE]` marker); the bytes themselves are forwarded untouched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = b"[DONE]"
MAX_LINE_BYTES = 1 << 20  # a longer unfinished line is not an event we account for: dropped, not buffered


@dataclass
class SseReader:
    """Feed it chunks; it records the last `usage` object seen and whether `data: [DONE]` arrived."""

    usage: dict[str, Any] | None = None
    done: bool = False
    _partial: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> None:
        if b"\n" not in chunk:
            self._keep(chunk)
            return
        head, *lines, rest = chunk.split(b"\n")
        self._line(bytes(self._partial) + head)
        self._partial.clear()
        for line in lines:
            self._line(line)
        self._keep(rest)

    def _keep(self, piece: bytes) -> None:
        if len(self._partial) + len(piece) > MAX_LINE_BYTES:
            self._partial.clear()  # not an event we account for: never an unbounded buffer
            return
        self._partial += piece

    def _line(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return  # comments, `event:`/`id:` fields, the blank line ending an event
        data = line[5:].strip()
        if data == DONE:
            self.done = True
        elif b'"usage"' in data:
            try:
                usage = json.loads(data).get("usage")
            except (ValueError, AttributeError):
                return
            if isinstance(usage, dict):
                self.usage = usage
