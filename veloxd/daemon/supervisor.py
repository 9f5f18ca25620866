"""Every supervised process (model servers, the gateway, the dashboard), and applying a plan in order.

A plan is applied as a rollout: stop removed and changed servers first and wait until they
have exited (ports and unified memory are free again), then start changed and added ones.
Unchanged servers are not touched; live-only updates replace the entry without a restart.
Rollouts of one lane run one after another; the dashboard has a lane of its own (it holds no
model memory and no port a server needs), so its restart never waits behind a server's stop.
A READY server whose new settings cannot start yet (a port another process holds, a model path
not there yet) is not stopped: its restart is held until they can (veloxd.daemon.held); an
edit back to the settings it runs drops the hold, and it is not restarted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from veloxd.daemon import messages as m
from veloxd.daemon.held import Held, blockers, held, holds, running_document, still_held, undone
from veloxd.daemon.server import ServerProcess
from veloxd.daemon.spawner import Spawner
from veloxd.daemon.state import ServerState
from veloxd.daemon.statefile import Changes
from veloxd.daemon.supervised import Supervised

if TYPE_CHECKING:
    from veloxd.config.plan import Plan

SERVERS = "servers"  # the lane of model servers and the gateway: what memory admission orders


@dataclass(eq=False)  # removed by identity: two rollouts may hold the same names
class Rollout:
    """Stop these servers, wait until all are STOPPED, drop `remove`, then start `start`."""

    stop: set[str]
    start: dict[str, Supervised | None]  # name -> entry to start with (None: its current entry, if it still exists)
    remove: set[str] = field(default_factory=set)
    reason: str = "reload"
    stopping: bool = False  # stops issued (only the rollout at the head of its lane acts)
    lane: str = SERVERS


class Supervisor:
    """Owns one ServerProcess per entry name. Called only from the daemon's loop thread."""

    def __init__(self, spawner: Spawner, log: Any, changes: Changes | None = None) -> None:
        self.servers: dict[str, ServerProcess] = {}
        self.rollouts: list[Rollout] = []
        self.held: dict[str, Held] = {}  # READY servers whose restart waits for the world (veloxd.daemon.held)
        self.changes = changes if changes is not None else Changes()  # shared with every ServerProcess
        self._spawner = spawner
        self._log = log

    # ---- plans --------------------------------------------------------------------------
    def apply(self, plan: Plan, desired: Mapping[str, Supervised], now: float, lane: str = SERVERS) -> None:
        """Apply a config plan: stop removed+changed, update live-only, then start changed+added.

        A FATAL server whose entry changed at all (even a live-only key such as a longer
        ready_timeout_s) is started again: the user has acted on it. A held server is compared
        with the settings it runs: the plan restarts it only if the new ones differ from those.
        """
        plan = self._drop_undone(plan, desired)
        revived = [n for n in plan.updated if n in self.servers and self.servers[n].state is ServerState.FATAL]
        holding = self._hold(plan, desired, lane, now)
        plan_changed = [n for n in plan.changed if n not in holding]
        for name in plan.updated:
            if name in self.held:  # keeps the settings it runs until its restart goes ahead
                self.held[name].entry = desired[name]
            elif name in self.servers:
                self.servers[name].entry = desired[name]
                self.servers[name].recheck_soon(now)
        running = {n for n, s in self.servers.items() if s.state is not ServerState.STOPPED}
        candidates = [*plan_changed, *revived, *plan.added]
        # An on_demand server starts only on its first request, or again if it was running when it changed;
        # one switched to `start: always` while stopped starts now.
        candidates += [n for n in plan.updated if n not in running and desired[n].start == "always"]
        to_start: dict[str, Supervised | None] = {
            n: desired[n] for n in candidates if desired[n].start == "always" or n in running
        }
        for name in [*plan.added, *plan_changed]:
            if name not in to_start and name not in plan.removed:
                if name in self.servers:
                    self.servers[name].entry = desired[name]
                else:  # known (status, the gateway) but not started
                    self.servers[name] = self._new(desired[name])
        stop = {*plan.removed, *plan_changed, *revived}
        self.begin(Rollout(stop=stop, start=to_start, remove=set(plan.removed), lane=lane), now)

    def _drop_undone(self, plan: Plan, desired: Mapping[str, Supervised]) -> Plan:
        """Drop the hold of each held server the edit puts back on the settings it runs: no restart."""
        running = {n: self.servers[n].entry for n in self.held if n in self.servers}
        plan, dropped = undone(plan, running, desired)
        for name in dropped:
            del self.held[name]
            self.changes.bump()  # pending, held_reason
            pid = self.servers[name].pid
            self._log.info("server_restart_hold_dropped", server=name, pid=pid, reason="desired_matches_running")
        return plan

    def _hold(self, plan: Plan, desired: Mapping[str, Supervised], lane: str, now: float) -> set[str]:
        """Hold the restart of every changed READY server whose new settings cannot start yet."""
        for name in [*plan.removed, *plan.changed]:
            self.held.pop(name, None)  # removed, or changed again: decided afresh below
        stopping = {n: self.servers[n] for n in [*plan.removed, *plan.changed] if n in self.servers}
        stopped_ports = {n: s.entry.port for n, s in stopping.items() if s.state is not ServerState.STOPPED}
        # nothing serving to keep otherwise: the new settings start (or wait) as usual
        serving = {n: s.entry for n, s in stopping.items() if n in plan.changed and s.state is ServerState.READY}
        holding = holds(serving, desired, stopped_ports)
        for name, conditions in holding.items():
            self.held[name] = hold = held(desired[name], conditions, lane, now)
            self.changes.bump()
            self._log.warning(
                "server_restart_held",
                server=name,
                pid=self.servers[name].pid,
                reason=hold.reason,
                conditions=[c.to_dict() for c in conditions],
                recheck_s=round(hold.recheck_at - now, 3),
            )
        return set(holding)

    def _release_held(self, now: float) -> None:
        """Restart a held server once its new settings can start, or at once once it stopped serving."""
        for name, hold in list(self.held.items()):
            server = self.servers.get(name)
            serving = server is not None and server.state is ServerState.READY
            if serving and now < hold.recheck_at:
                continue
            conditions = blockers(server.entry, hold.entry) if server is not None and serving else []
            if conditions:
                if [c.to_dict() for c in conditions] != [c.to_dict() for c in hold.conditions]:
                    self.changes.bump()  # the reason status shows
                still_held(hold, conditions, now)
                continue
            del self.held[name]
            self._log.info("server_restart_released", server=name, serving=serving)
            self.begin(Rollout(stop={name}, start={name: hold.entry}, reason="held_restart", lane=hold.lane), now)

    def restart(self, names: Iterable[str], reason: str, now: float) -> None:
        """Stop and start these servers again (clearing their failure history)."""
        names = [n for n in names if n in self.servers]
        # A held restart asked for by hand goes ahead with the new settings (WAITING, visibly, if still blocked).
        start: dict[str, Supervised | None] = {n: h.entry if (h := self.held.pop(n, None)) else None for n in names}
        self.begin(Rollout(stop=set(names), start=start, reason=reason), now)

    def model_changed(self, names: Iterable[str], present: bool, now: float) -> list[str]:
        """A local model path changed, appeared or vanished; returns the servers restarted.

        WAITING servers look again at once. While the path is missing, running servers keep
        serving what they loaded and only FATAL ones are restarted (into WAITING, visibly);
        once it is back, or its files changed, every other server using it restarts, except one
        whose worker was spawned from what is there now, or whose start is queued: a WAITING
        server's recheck (or a held restart's) that found the path first has started it already.
        """
        names = [n for n in names if n in self.servers]
        for name in names:
            self.servers[name].recheck_soon(now)
            if name in self.held:  # its new model path may be there now: it restarts when the hold releases
                self.held[name].recheck_at = now
        movable = (ServerState.FATAL,) if not present else tuple(s for s in ServerState if s is not ServerState.WAITING)
        starting = {n for rollout in self.rollouts for n in rollout.start}  # will read what is there now
        restart = [
            n
            for n in names
            if n not in self.held
            and n not in starting
            and self.servers[n].state in movable
            and not self.servers[n].runs_current_model()
        ]
        self.restart(restart, "model_changed", now)
        return restart

    def recheck_waiting(self, now: float) -> None:
        """`veloxd reload` of unchanged bytes: WAITING servers look at the world again now."""
        for server in self.servers.values():
            server.recheck_soon(now)
        for hold in self.held.values():
            hold.recheck_at = now

    def begin(self, rollout: Rollout, now: float) -> None:
        """Queue a rollout; rollouts run one after another so none undoes another's stop."""
        self.rollouts.append(rollout)
        self.changes.bump()  # status shows what a queued rollout will do (pending)
        self._advance(now)

    def stop_all(self, now: float) -> None:
        """Shutdown: every server to STOPPING at once (they stop in parallel); no more starts."""
        self.rollouts.clear()
        self.held.clear()
        self.changes.bump()
        for server in self.servers.values():
            server.stop(now)

    @property
    def busy(self) -> bool:
        """A rollout of the servers' lane is still waiting for servers to stop (a reload waits for it)."""
        return any(r.lane == SERVERS for r in self.rollouts)

    def all_stopped(self) -> bool:
        return all(s.state is ServerState.STOPPED for s in self.servers.values())

    # ---- the loop's calls ----------------------------------------------------------------
    def on_message(self, msg: m.ChildReport, now: float) -> None:
        server = self.servers.get(msg.server)
        if server is None:
            return
        if isinstance(msg, m.ChildExited):
            server.on_exit(msg.spawn_id, msg.returncode, now)
        elif isinstance(msg, m.ReadyLine):
            server.on_ready_line(msg.spawn_id, msg.payload, msg.problem)
        elif isinstance(msg, m.DownloadLine):
            server.on_download_line(msg.spawn_id, msg.payload, now)
        elif isinstance(msg, m.HealthProbed):
            server.on_health_probed(msg.spawn_id, msg.sequence, msg.error, now)
        elif isinstance(msg, m.Healthy):
            server.on_healthy(msg.spawn_id, now)
        self._advance(now)

    def tick(self, now: float) -> None:
        for server in list(self.servers.values()):
            server.tick(now)
        self._release_held(now)
        self._advance(now)

    def next_deadline(self) -> float | None:
        deadlines = [d for s in self.servers.values() if (d := s.next_deadline()) is not None]
        deadlines += [hold.recheck_at for hold in self.held.values()]
        return min(deadlines, default=None)

    def _advance(self, now: float) -> None:
        """Run the head rollout of each lane: issue its stops, and once all have stopped, its starts."""
        while any(self._finished(head, now) for head in self._heads()):
            pass  # a finished head lets the next rollout of its lane act at once

    def _heads(self) -> list[Rollout]:
        heads: dict[str, Rollout] = {}
        for rollout in self.rollouts:
            heads.setdefault(rollout.lane, rollout)
        return list(heads.values())

    def _finished(self, rollout: Rollout, now: float) -> bool:
        """Issue this head's stops; once all have stopped, drop it, drop its removed, run its starts."""
        if not rollout.stopping:
            rollout.stopping = True
            for name in rollout.stop:
                if name in self.servers:
                    self.servers[name].stop(now)
        if any(self.servers[name].state is not ServerState.STOPPED for name in rollout.stop if name in self.servers):
            return False
        self.rollouts.remove(rollout)
        self.changes.bump()
        for name in rollout.remove:
            self.servers.pop(name, None)
        for name, entry in rollout.start.items():
            server = self.servers.get(name)
            if server is None:
                if entry is None:
                    continue  # restarted, but removed by an earlier rollout
                server = self.servers[name] = self._new(entry)
            if server.state is not ServerState.STOPPED:
                continue
            server.entry = entry or server.entry
            server.clear_failures()
            server.start(now)
        return True

    def _new(self, entry: Supervised) -> ServerProcess:
        return ServerProcess(entry, self._spawner, self._log, changes=self.changes)

    def snapshot(self) -> dict[str, Any]:
        """Each server's facts, with what a queued rollout will still do to it: a READY server whose
        restart waits behind another rollout is not settled, and status must not say it is."""
        pending = self.pending()
        return {
            name: {
                **server.snapshot(),
                "pending": pending.get(name),
                "held_reason": self.held[name].reason if name in self.held else None,
                "held_runs": running_document(server.entry) if name in self.held else None,  # for `veloxd plan`
            }
            for name, server in sorted(self.servers.items())
        }

    def pending(self) -> dict[str, str]:
        """name -> "restart", "stop" or "start": the first thing a queued rollout has yet to finish for it."""
        out: dict[str, str] = dict.fromkeys(self.held, "restart held")
        for rollout in self.rollouts:
            for name in sorted(rollout.stop | rollout.start.keys()):
                if name not in out:
                    stops, starts = name in rollout.stop, name in rollout.start
                    out[name] = "restart" if stops and starts else "stop" if stops else "start"
        return out
