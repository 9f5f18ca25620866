"""Liveness of a READY worker: when to probe its /health, and when failed probes mean it hangs.

Pure decisions over a small immutable record and a monotonic `now` (tests drive them with a fake
clock); ServerProcess acts on them, the Spawner runs each probe on its own thread so a probe that
waits out its timeout never blocks the daemon's loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol


class HealthPolicy(Protocol):
    """What the decisions read of an entry's `health` section (veloxd.config.sections.Health, frozen)."""

    @property
    def interval_s(self) -> float: ...

    @property
    def timeout_s(self) -> float: ...

    @property
    def failures(self) -> int: ...


@dataclass(frozen=True)
class Liveness:
    """Probing state of one ready worker: `failures` in a row, the next probe's time, one in flight."""

    next_probe_at: float
    failures: int = 0
    in_flight: int | None = None  # the sequence number of the probe running now
    sequence: int = 0


def on_ready(now: float, policy: HealthPolicy) -> Liveness:
    """The worker just became READY (its /health answered): the first probe one interval later."""
    return Liveness(next_probe_at=now + policy.interval_s)


def probe_due(live: Liveness, now: float) -> bool:
    """A probe should start now: its time has come and none is still running (never two at once)."""
    return live.in_flight is None and now >= live.next_probe_at


def probe_started(live: Liveness) -> Liveness:
    sequence = live.sequence + 1
    return replace(live, in_flight=sequence, sequence=sequence)


def probe_finished(live: Liveness, sequence: int, error: str | None, now: float, policy: HealthPolicy) -> Liveness:
    """Record a probe's outcome (`error` None: 200). A report of another probe changes nothing.

    The next probe is one interval after this one ended, so a slow answer is not followed by a
    burst of probes that queue behind it.
    """
    if sequence != live.in_flight:
        return live
    failures = 0 if error is None else live.failures + 1
    return replace(live, in_flight=None, failures=failures, next_probe_at=now + policy.interval_s)


def rescheduled(live: Liveness, now: float, policy: HealthPolicy) -> Liveness:
    """The entry's health keys changed (a live update): a shorter interval counts from now at once."""
    return replace(live, next_probe_at=min(live.next_probe_at, now + policy.interval_s))


def hung(live: Liveness, policy: HealthPolicy) -> bool:
    """`policy.failures` probes in a row failed: the worker is unresponsive."""
    return live.failures >= policy.failures


def next_deadline(live: Liveness) -> float | None:
    """When the loop must wake up for this worker's liveness (None while a probe runs: its report wakes it)."""
    return live.next_probe_at if live.in_flight is None else None
