"""What the gateway counts for /metrics: its admissions, unloads, refusals and requests (GatewayCounters).

The gateway is the only process that knows these: the daemon carries out a start or an unload
but does not know that admission chose it, and requests refused at the gateway (401, 404, 503)
never reach a worker's own counters. Counts live as long as the gateway process, like any
process's counters (Prometheus' rate() handles a restart's reset).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from veloxd.gateway.events import RequestRecord

NO_SERVER = ""  # the server label of a request routed to none (no model, unknown model)


class GatewayTally:
    def __init__(self, queues: Callable[[], Mapping[str, int]] = dict) -> None:
        self._queues = queues  # the fleet's per-server waiting requests, read at scrape time
        self._admissions: Counter[str] = Counter()
        self._refusals: Counter[str] = Counter()
        self._unloads: Counter[tuple[str, str]] = Counter()
        self._requests: Counter[tuple[str, str]] = Counter()

    # ---- recorded by the fleet and the request path ------------------------------------------
    def admitted(self, name: str) -> None:
        self._admissions[name] += 1

    def refused(self, name: str) -> None:
        self._refusals[name] += 1

    def unloaded(self, name: str, reason: str) -> None:
        self._unloads[(name, reason)] += 1

    def finished(self, record: RequestRecord) -> None:
        """An Accounting listener: one more request answered with `record.status`."""
        self._requests[(record.server or NO_SERVER, str(record.status))] += 1

    # ---- read by the collector (veloxd.web.metrics.GatewayCounters) --------------------------
    def admissions_total(self) -> Mapping[str, int]:
        return dict(self._admissions)

    def admission_refusals_total(self) -> Mapping[str, int]:
        return dict(self._refusals)

    def unloads_total(self) -> Mapping[tuple[str, str], int]:
        return dict(self._unloads)

    def requests_total(self) -> Mapping[tuple[str, str], int]:
        return dict(self._requests)

    def queue_depth(self) -> Mapping[str, int]:
        return dict(self._queues())
