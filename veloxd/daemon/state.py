"""Server states, the one table of legal transitions, and the pure restart decisions.

Imports nothing but the stdlib, so every daemon module (and `veloxd status`) can use it.
FATAL is entered straight from the state that failed (STARTING or READY) once the failure
limit is reached, rather than after one last pointless backoff wait.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol


class ServerState(enum.Enum):
    """Lifecycle of one server entry; the values are what logs and the state file show."""

    STOPPED = "stopped"
    DOWNLOADING = "downloading"  # fetching the model before loading; outside ready_timeout_s
    WAITING = "waiting"  # a condition of the world (model path, host, port, env var, hub, disk) is not met yet
    STARTING = "starting"
    READY = "ready"
    UNRESPONSIVE = "unresponsive"  # ready, then its /health failed N probes in a row: being killed
    BACKOFF = "backoff"
    FATAL = "fatal"
    STOPPING = "stopping"


S = ServerState
TRANSITIONS: Final[Mapping[ServerState, frozenset[ServerState]]] = {
    S.STOPPED: frozenset({S.DOWNLOADING, S.STARTING, S.WAITING}),
    # DOWNLOADING -> STARTING once the model is complete; FATAL = not found, gated, unauthorized, offline.
    # DOWNLOADING -> WAITING when the hub is out of reach or the disk full, or when, the model
    # complete, the port or an env var is not there yet.
    S.DOWNLOADING: frozenset({S.STARTING, S.WAITING, S.BACKOFF, S.FATAL, S.STOPPING}),
    # WAITING -> STARTING (or DOWNLOADING) once its condition cleared (a watch or the recheck schedule).
    S.WAITING: frozenset({S.DOWNLOADING, S.STARTING, S.STOPPING}),
    # STARTING -> READY needs the READY line and /health 200; FATAL = unfixable (exit 2); WAITING =
    # the worker found its port taken after the daemon's check (exit 4).
    S.STARTING: frozenset({S.READY, S.BACKOFF, S.FATAL, S.WAITING, S.STOPPING}),
    S.READY: frozenset({S.BACKOFF, S.FATAL, S.STOPPING, S.UNRESPONSIVE}),  # unexpected exit; hung
    # UNRESPONSIVE: SIGTERM sent, SIGKILL after stop_timeout_s; its exit is a failure (BACKOFF or
    # FATAL, as a crash), or STOPPED-bound when a stop was asked meanwhile.
    S.UNRESPONSIVE: frozenset({S.BACKOFF, S.FATAL, S.STOPPING}),
    S.BACKOFF: frozenset({S.DOWNLOADING, S.STARTING, S.WAITING, S.STOPPING}),  # delay over, or stopped meanwhile
    S.FATAL: frozenset({S.STOPPING}),  # only a config change or `veloxd restart NAME` leaves it
    S.STOPPING: frozenset({S.STOPPED}),  # SIGTERM to the group, SIGKILL after stop_timeout_s
}


class IllegalTransition(RuntimeError):
    """An edge missing from TRANSITIONS was requested: a bug in the daemon, not a user error."""


def transition(current: ServerState, new: ServerState) -> ServerState:
    """Return `new` if `current -> new` is in the table, else raise IllegalTransition."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current.value} -> {new.value} is not a legal transition")
    return new


class RestartPolicy(Protocol):
    """What the decisions read of an entry's `restart` section (veloxd.config.RestartPolicy, frozen)."""

    @property
    def max_failures(self) -> int: ...

    @property
    def window_s(self) -> float: ...

    @property
    def backoff_initial_s(self) -> float: ...

    @property
    def backoff_max_s(self) -> float: ...


@dataclass(frozen=True)
class Retry:
    """Go to BACKOFF and start again after `delay_s`."""

    delay_s: float
    failures: int  # failures inside the window, this one included


@dataclass(frozen=True)
class GiveUp:
    """Go to FATAL: retrying cannot help (or the limit is reached)."""

    reason: str
    failures: int


def backoff_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Delay before retry number `failures` (1-based): initial, doubling, capped at max."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    return min(max_s, initial_s * 2.0 ** (failures - 1))


def recheck_delay(attempt: int, initial_s: float = 1.0, max_s: float = 30.0) -> float:
    """Delay before looking again at a WAITING entry's condition (1-based attempt).

    Backoff-like so a port held for hours costs nothing, capped so a freed port is noticed
    within `max_s`; conditions a watch can see (a model path appearing) are noticed at once.
    """
    return backoff_delay(attempt, initial_s, max_s)


def failures_in_window(failure_times: Iterable[float], now: float, window_s: float) -> list[float]:
    """The failure times (monotonic seconds) that lie within the last `window_s` before `now`."""
    return [t for t in failure_times if now - t <= window_s]


def after_failure(
    failure_times: Iterable[float], now: float, policy: RestartPolicy, unfixable: str | None = None
) -> Retry | GiveUp:
    """Decide what a failure at `now` leads to, given the earlier failure times.

    `unfixable` names a failure that retrying cannot cure (exit code 2: invalid input or a
    port held by someone else): FATAL at once.
    """
    recent = failures_in_window(failure_times, now, policy.window_s)
    count = len(recent) + 1
    if unfixable is not None:
        return GiveUp(reason=unfixable, failures=count)
    if count >= policy.max_failures:
        return GiveUp(reason=f"{count} failures within {policy.window_s:g}s", failures=count)
    return Retry(
        delay_s=backoff_delay(count, policy.backoff_initial_s, policy.backoff_max_s),
        failures=count,
    )
