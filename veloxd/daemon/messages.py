"""Messages to the daemon's state-owning thread. Everyone else (signal handlers, the watcher,
child reader/waiter threads, the control socket) only puts one of these on its queue.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConfigTouched:
    """Something happened to the config file (or its directory entry)."""


@dataclass(frozen=True)
class ModelTouched:
    """A file in a watched local model directory changed."""

    directory: str


@dataclass(frozen=True)
class ReloadRequested:
    """SIGHUP or `veloxd reload`: re-read the config now (no debounce)."""

    source: str
    reply: Reply | None = None


@dataclass(frozen=True)
class RestartRequested:
    """`veloxd restart NAME`: stop and start that server, clearing its failures."""

    name: str
    reply: Reply | None = None


@dataclass(frozen=True)
class StatusRequested:
    reply: Reply


@dataclass(frozen=True)
class GatewayViewRequested:
    """The gateway asks for every entry's routing facts, state, port and memory need.

    With `known` (the etag of the view it holds) and `wait_s`, the answer waits until the view
    differs from that one or `wait_s` passes (veloxd/daemon/longpoll.py).
    """

    reply: Reply
    known: str | None = None
    wait_s: float = 0.0


@dataclass(frozen=True)
class StartRequested:
    """The gateway starts an on-demand server, first stopping `unload` (memory admission)."""

    name: str
    unload: tuple[str, ...]
    reply: Reply


@dataclass(frozen=True)
class UnloadRequested:
    """The gateway stops an on-demand server: idle for its idle_unload_s, or to make room."""

    name: str
    reason: str
    reply: Reply


@dataclass(frozen=True)
class Shutdown:
    """SIGINT/SIGTERM, stamped when the handler ran (monotonic): two copies of one Ctrl-C are told
    apart from a second press by when they arrived, not by when a busy loop got to them."""

    signum: int
    received_at: float


@dataclass(frozen=True)
class WrapperGone:
    """The descriptor given by `veloxd run --lifeline-fd` reached EOF: the wrapper that started the
    daemon (make run's demo) is gone, however it died."""

    fd: int


@dataclass(frozen=True)
class ChildReport:
    """What a spawn's reader, waiter or prober thread reports: of which server, which of its spawns."""

    server: str
    spawn_id: int


@dataclass(frozen=True)
class ChildExited(ChildReport):
    returncode: int


@dataclass(frozen=True)
class ReadyLine(ChildReport):
    payload: dict[str, Any]
    problem: str | None = None  # how the line breaks veloxd.protocol (the worker is then refused)


@dataclass(frozen=True)
class DownloadLine(ChildReport):
    """A `VELOXD_DOWNLOAD {json}` line of an entry's download step (veloxd/download/protocol.py)."""

    payload: dict[str, Any]


@dataclass(frozen=True)
class Healthy(ChildReport):
    pass


@dataclass(frozen=True)
class HealthProbed(ChildReport):
    """One liveness probe of a READY worker ended: `error` None means /health answered 200."""

    sequence: int
    error: str | None


@dataclass(eq=False)
class Reply:
    """A one-shot answer slot: the loop fills it, the control thread waits on it (and marks it
    abandoned when its client went, so a held request is dropped instead of answered)."""

    _box: queue.SimpleQueue[dict[str, Any]] = field(default_factory=queue.SimpleQueue)
    _gone: threading.Event = field(default_factory=threading.Event)

    def send(self, answer: dict[str, Any]) -> None:
        self._box.put(answer)

    def wait(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self._box.get(timeout=timeout)
        except queue.Empty:
            return None

    def abandon(self) -> None:
        self._gone.set()

    @property
    def abandoned(self) -> bool:
        return self._gone.is_set()


Message = (
    ConfigTouched
    | ModelTouched
    | ReloadRequested
    | RestartRequested
    | StatusRequested
    | GatewayViewRequested
    | StartRequested
    | UnloadRequested
    | Shutdown
    | ChildExited
    | ReadyLine
    | DownloadLine
    | Healthy
    | HealthProbed
)
