"""Request counters of one worker, served as JSON on `GET /veloxd/stats` (stdlib only).

The worker counts; the dashboard process (veloxd/web/) reads every worker's counters and
exposes them as Prometheus series. Counters start at zero with each worker process, as any
process's counters do (Prometheus' rate() handles the reset).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

STATS_PATH = "/veloxd/stats"
STATS_SCHEMA_VERSION = 1
# Whole requests: a short completion on a small model up to a long generation on a big one.
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Time to the first generated token: prompt processing (prefill) dominates.
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

T = TypeVar("T")


class Histogram:
    """Observation counts per upper bound (the last slot is +Inf), their sum and count."""

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def to_dict(self) -> dict[str, Any]:
        """Cumulative buckets as Prometheus has them: [[upper bound, observations <= it], ...]."""
        cumulative, total = [], 0
        for bound, count in zip((*self.bounds, "+Inf"), self.counts):
            total += count
            cumulative.append([bound, total])
        return {"buckets": cumulative, "sum": round(self.sum, 6), "count": total}


class RequestStats:
    """Thread-safe counters of the HTTP requests one worker answered (its handler threads write)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.started = clock()
        self.by_status: Counter[str] = Counter()
        self.in_flight = 0
        self.latency = Histogram(LATENCY_BUCKETS_S)
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.generated_tokens = 0
        self.prompt_tokens = 0

    def begin(self) -> RequestTimer:
        with self._lock:
            self.in_flight += 1
        return RequestTimer(self, self._clock())

    def _finish(self, timer: RequestTimer, status: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.by_status[str(status)] += 1
            self.latency.observe(self._clock() - timer.started)

    def _first_token(self, timer: RequestTimer) -> None:
        with self._lock:
            self.ttft.observe(self._clock() - timer.started)

    def _tokens(self, generated: int = 0, prompt: int = 0) -> None:
        with self._lock:
            self.generated_tokens += generated
            self.prompt_tokens += prompt

    def to_dict(self, queued: int | None = None) -> dict[str, Any]:
        """What `GET /veloxd/stats` answers; `queued`: requests waiting for the generation thread."""
        with self._lock:
            return {
                "schema_version": STATS_SCHEMA_VERSION,
                "uptime_s": round(self._clock() - self.started, 3),
                "requests": dict(self.by_status),
                "in_flight": self.in_flight,
                "queued": queued,
                "generated_tokens": self.generated_tokens,
                "prompt_tokens": self.prompt_tokens,
                "latency_s": self.latency.to_dict(),
                "ttft_s": self.ttft.to_dict(),
            }


class RequestTimer:
    """One request's clock: counts its tokens as they stream by and its end with a status."""

    def __init__(self, stats: RequestStats, started: float) -> None:
        self.stats = stats
        self.started = started
        self._done = False

    def prompt(self, tokens: int) -> None:
        self.stats._tokens(prompt=tokens)

    def tokens(self, stream: Iterable[T]) -> Iterator[T]:
        """Pass `stream` (one item per generated token) through, timing the first and counting all."""
        first = True
        for item in stream:
            if first:
                self.stats._first_token(self)
                first = False
            self.stats._tokens(generated=1)
            yield item

    def finish(self, status: int) -> None:
        if not self._done:
            self._done = True
            self.stats._finish(self, status)
