"""When a shutdown signal during shutdown means "do not wait": a pure decision, tested with a fake clock.

A second SIGINT/SIGTERM while the daemon is stopping SIGKILLs every worker instead of waiting
for their grace periods. But Ctrl-C in a terminal signals the whole foreground process group, so
a wrapper that also forwards it (`make run`'s demo, a shell script's trap) delivers the same
Ctrl-C twice within milliseconds. Signals closer together than REPEAT_WINDOW_S are one request.
"""

from __future__ import annotations

REPEAT_WINDOW_S = 1.0  # far above a forwarded copy's delay, below a person pressing Ctrl-C again


def forces_kill(first_at: float | None, now: float, window_s: float = REPEAT_WINDOW_S) -> bool:
    """Whether a shutdown signal handled at `now` (monotonic) forces SIGKILL, the first having been
    handled at `first_at` (None: this is the first)."""
    return first_at is not None and now - first_at >= window_s
