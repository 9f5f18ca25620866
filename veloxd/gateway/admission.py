"""Admission and idle unloading: pure decisions over plain numbers and a clock passed in. Stdlib only.

The gateway calls these with what it knows (running servers, their needs, in-flight requests,
last use); the daemon carries out the result (stop these, start that).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from veloxd.checks import gib


@dataclass(frozen=True)
class Resident:
    """A server that holds (or is about to hold) memory."""

    name: str
    need: int  # bytes; 0 when unknown
    on_demand: bool
    busy: bool  # requests in flight or queued: never unloaded
    last_used: float  # monotonic seconds
    idle_unload_s: float | None = None


@dataclass(frozen=True)
class Admit:
    unload: tuple[str, ...] = ()  # stop these first (least recently used first)


@dataclass(frozen=True)
class Refuse:
    need: int
    budget: int
    in_use: int  # the needs of every other resident server
    reason: str
    kept: int = 0  # of in_use, what stays after unloading every idle on-demand server (always, busy)

    def message(self, name: str) -> str:
        if self.need > self.budget:
            return f"cannot start '{name}': it needs {gib(self.need)}, more than the whole memory budget of {gib(self.budget)}"
        return (
            f"cannot start '{name}': it needs {gib(self.need)} of the memory budget of {gib(self.budget)}, and the "
            f"servers that cannot be unloaded (start: always, or busy) need {gib(self.kept)} of it ({self.reason})"
        )


def admit(name: str, need: int, residents: Sequence[Resident], budget: int | None) -> Admit | Refuse:
    """Admit `name` (needing `need` bytes) next to `residents` within `budget`.

    When it does not fit, idle on-demand residents are unloaded least recently used first until it
    does; `always` servers and busy ones are never unloaded.
    """
    others = [r for r in residents if r.name != name]
    in_use = sum(r.need for r in others)
    if budget is None:
        return Admit()
    if need > budget:
        return Refuse(need, budget, in_use, "more than the whole budget")
    free = budget - in_use
    unload: list[str] = []
    for resident in sorted((r for r in others if r.on_demand and not r.busy), key=lambda r: r.last_used):
        if need <= free:
            break
        unload.append(resident.name)
        free += resident.need
    if need <= free:
        return Admit(tuple(unload))
    return Refuse(need, budget, in_use, "even after unloading every idle on-demand server", kept=budget - free)


def idle(residents: Iterable[Resident], now: float) -> list[str]:
    """On-demand servers without requests for at least their idle_unload_s."""
    return [
        r.name
        for r in residents
        if r.on_demand and not r.busy and r.idle_unload_s is not None and now - r.last_used >= r.idle_unload_s
    ]


def next_idle(residents: Iterable[Resident]) -> float | None:
    """When the first of these becomes idle (as `idle` counts); None: none will without a change
    (a busy server's time starts when its last request ends)."""
    return min(
        (
            r.last_used + r.idle_unload_s
            for r in residents
            if r.on_demand and not r.busy and r.idle_unload_s is not None
        ),
        default=None,
    )
