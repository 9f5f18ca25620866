"""Download progress arithmetic: rate over a sliding window, ETA, throttling, human units.

Pure functions and one small value class; time is always passed in (monotonic seconds), so
tests drive them with a fake clock. Stdlib only: the daemon and `veloxd status` use them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW_S = 5.0  # long enough to smooth bursty reads, short enough to follow a slowdown
# No rate (so no ETA) until bytes have been flowing this long: over a shorter span the figure
# depends on how the bytes happen to be bunched into reads (at 120 kB/s one 32 KiB read more or
# less moves a 2 s figure by 14 %, a 3 s one by 9 %).
RATE_MIN_SPAN_S = 3.0
EVENT_EVERY_S = 10.0  # server_downloading at least this often while bytes arrive...
EVENT_STEP_PERCENT = 5.0  # ...and at each 5 % step...
EVENT_MIN_GAP_S = 1.0  # ...but never more than once a second


@dataclass
class Meter:
    """Bytes done of a total, with the transfer rate over the last RATE_WINDOW_S seconds.

    The first update is the reference (what was there before: a resumed download's bytes, the
    listing); the window opens at the first update that shows new bytes, so the time spent
    listing and connecting before the first byte never counts as a slow link, and it reopens when
    the count goes back (a file that had to start over)."""

    total: int
    done: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (time, done) since the window opened
    _referenced: bool = field(default=False, init=False, repr=False)

    def update(self, now: float, done: int, total: int | None = None) -> None:
        previous, self.done = self.done, done
        if total is not None:
            self.total = total
        if not self._referenced or done < previous:
            self._referenced = True
            self.samples.clear()  # the next update with new bytes opens the window
            return
        if not self.samples and done == previous:
            return  # no byte yet since the reference
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()

    def rate(self) -> float:
        """Bytes per second over the window; 0 while unknown (under RATE_MIN_SPAN_S of samples)."""
        if len(self.samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 - t0 >= RATE_MIN_SPAN_S else 0.0

    def eta(self) -> float | None:
        """Seconds left at the current rate; None while the rate is unknown or nothing moves."""
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
