"""Process facts for tests and benchmarks, through psutil (Linux and macOS alike)."""

from __future__ import annotations

import psutil


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def children(pid: int) -> list[int]:
    """The pids of `pid`'s direct children, sorted (the order they were started in, on one boot)."""
    return sorted(child.pid for child in psutil.Process(pid).children())
