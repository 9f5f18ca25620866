"""Download progress arithmetic: rate over a sliding window, ETA, throttling, human units.

Pure functions and one small value class; time is always passed in (monotonic seconds), so
tests drive them with a fake clock. Stdlib only: the daemon and `veloxd status` use them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW_S = 5.0  # long enough to smooth chunk bursts, short enough to follow a slowdown
EVENT_EVERY_S = 10.0  # server_downloading at least this often while bytes arrive...
EVENT_STEP_PERCENT = 5.0  # ...and at each 5 % step...
EVENT_MIN_GAP_S = 1.0  # ...but never more than once a second


@dataclass
class Meter:
    """Bytes done of a total, with the transfer rate over the last RATE_WINDOW_S seconds."""

    total: int
    done: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def update(self, now: float, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()

    def rate(self) -> float:
        """Bytes per second over the window (0 until two samples are a moment apart)."""
        if len(self.samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return max(0.0, (d1 - d0) / (t1 - t0)) if t1 > t0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        return max(0.0, (self.total - self.done) / rate) if rate > 0 else None


def should_report(last_at: float | None, last_percent: float, now: float, percent: float) -> bool:
    """Whether a progress event is due: the first one, a new 5 % step, or 10 s of silence."""
    if last_at is None:
        return True
    gap = now - last_at
    if gap < EVENT_MIN_GAP_S:
        return False
    crossed = int(percent // EVENT_STEP_PERCENT) > int(last_percent // EVENT_STEP_PERCENT)
    return crossed or gap >= EVENT_EVERY_S


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB' (powers of 1000, as download sizes are shown on the hub)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "?"
    whole = round(s)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def summary(done: int, total: int, rate: float, eta: float | None) -> str:
    """'42.0% 1.2 GB of 2.9 GB, 12.0 MB/s, ~2m10s left'"""
    from veloxd.download.protocol import percent

    text = f"{percent(done, total):.1f}% {human_bytes(done)} of {human_bytes(total)}"
    if rate > 0:
        text += f", {human_bytes(rate)}/s, ~{human_seconds(eta)} left"
    return text
