"""Events of the gateway process, and per-request accounting (the one place a request is counted).

The gateway prints `VELOXD_EVENT {json}` lines on stdout; the daemon logs each as an event of its
own JSON log (veloxd.daemon.supervisor), so `veloxd logs` shows gateway events with the rest.
Listeners (metrics, a dashboard) subscribe to finished requests with `Accounting.listen`.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from veloxd.protocol import EVENT_PREFIX


class _Writer:
    """Writes event lines from a thread: a daemon slow to drain the pipe never stalls the event loop."""

    def __init__(self) -> None:
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.dropped = 0
        threading.Thread(target=self._run, name="events", daemon=True).start()

    def put(self, line: str) -> None:
        if self._lines.qsize() >= MAX_QUEUED:
            self.dropped += 1  # reported with the next line that gets through
            return
        self._lines.put(line)

    def _run(self) -> None:
        out = sys.stdout.buffer
        while True:
            lines = [self._lines.get()]
            time.sleep(BATCH_S)  # batch: a busy gateway wakes this thread (and the daemon) once per batch
            while not self._lines.empty() and len(lines) < 4096:
                lines.append(self._lines.get_nowait())
            try:
                out.write("".join(lines).encode())
                out.flush()
            except OSError:
                return  # the daemon is gone; the lifeline stops us shortly


MAX_QUEUED = 100_000
BATCH_S = 0.05
REQUEST_FINISHED = "gateway_request_finished"  # one per completion request, whatever its outcome
# RequestRecord.cancelled: why the gateway gave up on the client before the whole answer was sent.
CLIENT_DISCONNECTED = "client_disconnected"  # it closed its connection
CLIENT_STALLED = "client_stalled"  # it stopped reading: a write waited CLIENT_WRITE_TIMEOUT_S
_writer: _Writer | None = None


def emit(event: str, level: str = "info", **fields: Any) -> None:
    global _writer
    if _writer is None:
        _writer = _Writer()
    if _writer.dropped:
        fields["events_dropped"], _writer.dropped = _writer.dropped, 0
    _writer.put(EVENT_PREFIX + json.dumps({"event": event, "level": level, **fields}, default=str) + "\n")


@dataclass
class RequestRecord:
    """One request through the gateway, filled in as it goes."""

    method: str
    path: str
    model: str | None = None  # as the client asked
    server: str | None = None  # the entry it was routed to
    status: int = 0
    stream: bool = False
    tokens_in: int | None = None
    tokens_out: int | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    queued_s: float = 0.0  # waiting for a start and for a concurrency slot
    first_byte_s: float | None = None
    latency_s: float | None = None
    answered: bool = False  # the client was sent the whole answer: leaving after it is no disconnect
    cancelled: str | None = None  # CLIENT_DISCONNECTED or CLIENT_STALLED: the gateway stopped the request

    def fields(self) -> dict[str, Any]:
        out = dict(vars(self))  # flat fields: no deep copy (asdict costs more than the rest of the event)
        out.pop("started")
        out.pop("answered")
        for key in ("queued_s", "first_byte_s", "latency_s"):
            if out[key] is not None:
                out[key] = round(out[key], 4)
        return out


Listener = Callable[[RequestRecord], None]


class Accounting:
    """Finishes records: the `gateway_request_finished` event, then every listener."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def finish(self, record: RequestRecord) -> None:
        record.latency_s = time.monotonic() - record.started
        level = "warning" if record.status >= 500 or record.error else "info"
        emit(REQUEST_FINISHED, level, **record.fields())
        for listener in self._listeners:
            listener(record)
