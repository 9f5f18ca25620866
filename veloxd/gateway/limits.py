"""The gateway's bounds, read from the live `gateway:` settings, and a throttle for repeated events.

Settings arrive with the daemon's view (Fleet.settings) and may change on reload, so each bound
is read where it applies (per connection, per request); a key the view lacks takes the default
declared in veloxd.config.gateway, the one source of every default. Pure: no I/O, clock passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from veloxd.config.gateway import Gateway
from veloxd.gateway.upstream import Timeouts

DEFAULTS = {f.name: f.default for f in dataclasses.fields(Gateway) if f.default is not dataclasses.MISSING}
# Each write to a client (a stream's chunk, a whole answer) waits at most this long for the client
# to read: one that stops reading with its connection open is then given up (client_stalled) and
# its worker stops generating. Not a `gateway:` key (yet): nginx's send_timeout has the same default.
CLIENT_WRITE_TIMEOUT_S = 60.0


def setting(settings: Mapping[str, Any], name: str) -> Any:
    value = settings.get(name)
    return DEFAULTS[name] if value is None else value


def upstream_timeouts(settings: Mapping[str, Any]) -> Timeouts:
    return Timeouts(**{f.name: float(setting(settings, f.name)) for f in dataclasses.fields(Timeouts)})


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    keepalive_timeout_s: float
    max_connections: int

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> ConnectionLimits:
        return cls(
            float(setting(settings, "header_timeout_s")),
            float(setting(settings, "keepalive_timeout_s")),
            int(setting(settings, "max_connections")),
        )


class Throttle:
    """Counts occurrences; `note` returns the count to report at most once per `every_s` (else None).

    The first occurrence is reported at once; later ones are summed into the next report, so a
    condition that repeats thousands of times a second is one event a period, with its count.
    """

    def __init__(self, every_s: float, clock: Callable[[], float]) -> None:
        self.every_s = every_s
        self.clock = clock
        self.pending = 0
        self.total = 0
        self._last: float | None = None

    def note(self, count: int = 1) -> int | None:
        self.pending += count
        self.total += count
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            return None
        self._last, reported, self.pending = now, self.pending, 0
        return reported
