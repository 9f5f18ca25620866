"""Held restarts: a changed entry whose new settings cannot start yet keeps its running server.

An edit that moves a READY server to a port another process holds, or to a model path not there
yet, used to stop the server and leave it WAITING: a good server taken down by an edit the world
is not ready for. Such a restart is held instead: the old worker keeps serving with the settings
it runs, status shows `restart held` and why, and the restart goes ahead (stop, then start with
the new settings) once the conditions clear, looked at again with WAITING's backoff and at once
when a watch sees the config or a model path change. An edit back to the settings the held server
runs undoes the restart: the hold is dropped and nothing restarts (`undone`).

The decisions are pure (`blockers`, given the world check; `undone`); the supervisor keeps the book.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from veloxd.config.plan import Plan, changed_keys
from veloxd.config.world import Condition, entry_conditions, port_problem
from veloxd.daemon.state import recheck_delay
from veloxd.daemon.supervised import Supervised

WorldCheck = Callable[[Supervised], list[Condition]]  # conditions other than its own port


def world_without_port(entry: Supervised) -> list[Condition]:
    return entry_conditions(entry, ports=False)


def blockers(
    running: Supervised,
    desired: Supervised,
    check: WorldCheck = world_without_port,
    port_check: Callable[[str, int], str | None] = port_problem,
    freed: frozenset[int] = frozenset(),
) -> list[Condition]:
    """What keeps `desired` from starting in place of the running `running`: its world conditions,
    and its port only when it moves (the running worker holds its own port) to one that the same
    plan does not free (`freed`: ports of our servers it stops, as when two servers swap ports)."""
    found = list(check(desired))
    moved = (desired.host, desired.port) != (running.host, running.port)
    if moved and desired.port not in freed and (problem := port_check(desired.host, desired.port)):
        found.append(Condition("port", ("port",), problem))
    return found


def holds(
    serving: Mapping[str, Supervised],
    desired: Mapping[str, Supervised],
    stopped_ports: Mapping[str, int],
    check: WorldCheck = world_without_port,
    port_check: Callable[[str, int], str | None] = port_problem,
) -> dict[str, list[Condition]]:
    """The restarts to hold, and why: of the changed servers now serving (`serving`: the entries
    they run), those whose `desired` settings cannot start. `stopped_ports` are the ports of the
    servers the plan stops or restarts; a held server keeps its port, so holding one can hold
    another that was to move onto it (looked at again until nothing more is held)."""
    held: dict[str, list[Condition]] = {}
    while True:
        freed = frozenset(port for name, port in stopped_ports.items() if name not in held)
        more = {
            name: conditions
            for name, running in serving.items()
            if name not in held and (conditions := blockers(running, desired[name], check, port_check, freed))
        }
        if not more:
            return held
        held.update(more)


def foreseen(
    plan: Plan,
    current: Mapping[str, Supervised],
    desired: Mapping[str, Supervised],
    serving: Collection[str],
    check: WorldCheck = world_without_port,
    port_check: Callable[[str, int], str | None] = port_problem,
) -> dict[str, list[Condition]]:
    """What `veloxd plan` foresees, per server the plan starts or restarts: the conditions that
    will hold its restart (a changed server in `serving`) or make it wait (any other), by the
    supervisor's rules: the ports of the servers the plan stops or restarts count free, except
    those of held servers."""
    stopped_ports = {n: current[n].port for n in [*plan.removed, *plan.changed] if n in current}
    ready = {n: current[n] for n in plan.changed if n in serving and n in current}
    found = holds(ready, desired, stopped_ports, check, port_check)
    freed = frozenset(port for name, port in stopped_ports.items() if name not in found)
    for name in [*plan.changed, *plan.added]:
        if name in found:
            continue
        entry = desired[name]
        conditions = list(check(entry))
        if entry.port not in freed and (problem := port_check(entry.host, entry.port)):
            conditions.append(Condition("port", ("port",), problem))
        if conditions:
            found[name] = conditions
    return found


@runtime_checkable
class Keyed(Protocol):
    """An entry that tells its restart keys from its live ones (a server's, the gateway's)."""

    def process_key(self) -> dict[str, Any]: ...

    def live_key(self) -> dict[str, Any]: ...


def live_changes(running: Supervised, desired: Supervised) -> tuple[str, ...] | None:
    """The live keys to update when `desired` starts the very process `running` runs; None when
    it would start another one (an entry without restart keys, the dashboard's: any difference)."""
    if isinstance(running, Keyed) and isinstance(desired, Keyed):
        if running.process_key() != desired.process_key():
            return None
        return changed_keys(running.live_key(), desired.live_key())
    return () if running == desired else None


def undone(plan: Plan, running: Mapping[str, Supervised], desired: Mapping[str, Supervised]) -> tuple[Plan, list[str]]:
    """`plan` compared, for each held server (`running`: the entry it runs), with what it runs rather
    than with the settings the last config asked of it: an edit back to those settings undoes the
    held restart, so the server is updated in place (the live keys that differ) or left alone.
    Returns that plan and the servers whose held restart it undoes."""
    back = {
        name: keys
        for name, entry in running.items()
        if name in desired and name not in plan.removed and (keys := live_changes(entry, desired[name])) is not None
    }
    if not back:
        return plan, []
    updated = {n: k for n, k in plan.updated.items() if n not in back} | {n: k for n, k in back.items() if k}
    return (
        replace(
            plan,
            changed={n: k for n, k in plan.changed.items() if n not in back},
            updated=updated,
            unchanged=(*(n for n in plan.unchanged if n not in back), *(n for n, k in back.items() if not k)),
        ),
        list(back),
    )


def running_document(entry: Supervised) -> dict[str, Any] | None:
    """What a held server runs, as its config block is stored in the state file (env redacted),
    so `veloxd plan` compares an edit with it (`with_running`); None for the dashboard's entry."""
    from veloxd.config.gateway import GatewayEntry
    from veloxd.config.model import ServerEntry
    from veloxd.config.secrets import redact_env

    if isinstance(entry, GatewayEntry):
        return entry.gateway.to_dict()
    if not isinstance(entry, ServerEntry):
        return None
    data = entry.to_dict()
    if data.get("env"):
        data["env"] = redact_env(data["env"], data.get("api_key_env"))
    return data


def with_running(config: Mapping[str, Any], servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The state file's config (`config_to_dict` form) with each held server's block replaced by the
    one it runs (`held_runs` of its state): what a reload compares an edit with."""
    from veloxd.config.gateway import GATEWAY_NAME

    out = {**config, "servers": dict(config.get("servers") or {})}
    for name, server in servers.items():
        runs = server.get("held_runs") if isinstance(server, Mapping) else None
        if not isinstance(runs, Mapping):
            continue
        if name == GATEWAY_NAME and out.get("gateway") is not None:
            out["gateway"] = dict(runs)
        elif name in out["servers"]:
            out["servers"][name] = dict(runs)
    return out


@dataclass
class Held:
    """One held restart: the entry to start once `conditions` clear."""

    entry: Supervised
    conditions: list[Condition]
    lane: str
    recheck_at: float
    rechecks: int = 1

    @property
    def reason(self) -> str:
        return "; ".join(c.message for c in self.conditions)


def held(entry: Supervised, conditions: list[Condition], lane: str, now: float) -> Held:
    return Held(entry, conditions, lane, now + recheck_delay(1))


def still_held(hold: Held, conditions: list[Condition], now: float) -> Held:
    """The same hold looked at again: next look after WAITING's backoff."""
    hold.rechecks += 1
    hold.conditions = conditions
    hold.recheck_at = now + recheck_delay(hold.rechecks)
    return hold
