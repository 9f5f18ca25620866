"""The servers as the gateway sees them: the daemon's view, routing names, and readiness on demand.

One asyncio task polls the daemon's view (fast while requests wait for a start, slowly
otherwise) and unloads idle on-demand servers. `ensure_ready(name)` makes a request wait until its
server is ready: the first request for a stopped on-demand server runs admission and asks the
daemon to start it; every concurrent request for it awaits that same start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veloxd.gateway import admission
from veloxd.gateway.events import emit
from veloxd.gateway.link import DaemonGone, DaemonLink
from veloxd.gateway.tally import GatewayTally

POLL_IDLE_S = 0.5
POLL_WAITING_S = 0.05  # while a request waits for a server to become ready
DEFAULT_START_TIMEOUT_S = 300.0


class Unavailable(Exception):
    """The server cannot take the request now: 503 (with Retry-After when waiting could help)."""

    def __init__(self, message: str, retry_after_s: int | None = None, **facts: Any) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.facts = facts


@dataclass
class Slot:
    """Gateway-side facts of one server: its request queue and when it was last used."""

    limit: int
    semaphore: asyncio.Semaphore
    last_used: float
    in_flight: int = 0  # forwarded, or waiting (for a start or a concurrency slot)
    forwarding: int = 0  # holding a concurrency slot: in_flight - forwarding are queued
    state: str = "stopped"
    unloading: bool = False


class Fleet:
    def __init__(self, link: DaemonLink, clock: Callable[[], float] = time.monotonic) -> None:
        self.link = link
        self.clock = clock
        self.view: dict[str, Any] = {"servers": {}, "gateway": None, "budget": None}
        self.slots: dict[str, Slot] = {}
        self.routes: dict[str, str] = {}  # model name a client may send -> entry name
        self._refreshed = asyncio.Event()
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._pending: dict[str, float] = {}  # start requested (until when we count on it), not yet in the view
        self._admission = asyncio.Lock()
        self._waiting = 0
        self.tally = GatewayTally(self.queued)

    def queued(self) -> dict[str, int]:
        """Requests per server waiting in the gateway: for a start, or for a concurrency slot."""
        return {name: max(0, slot.in_flight - slot.forwarding) for name, slot in self.slots.items()}

    # ---- the daemon's view ----------------------------------------------------------------
    @property
    def settings(self) -> dict[str, Any]:
        return self.view.get("gateway") or {}

    @property
    def servers(self) -> dict[str, Any]:
        return self.view.get("servers") or {}

    async def refresh(self) -> None:
        answer = await self.link.view()
        if answer.get("ok"):
            self._apply(answer)
        event, self._refreshed = self._refreshed, asyncio.Event()
        event.set()  # wakes everyone waiting for a newer view

    def _apply(self, view: dict[str, Any]) -> None:
        now = self.clock()
        self.view = view
        servers = self.servers
        for name, server in servers.items():
            slot = self.slots.get(name)
            limit = int(server.get("concurrency") or 1)
            if slot is None:
                slot = self.slots[name] = Slot(limit, asyncio.Semaphore(limit), now)
            elif slot.limit != limit:
                # The same Slot keeps counting (requests in flight hold it and decrement it when they
                # end); only new requests queue on the new semaphore, those holding the old one finish.
                slot.limit, slot.semaphore = limit, asyncio.Semaphore(limit)
            if server["state"] != slot.state and server["state"] in ("starting", "ready"):
                slot.last_used = max(slot.last_used, now)  # idle time counts from the (re)start
            slot.state = server["state"]
            if slot.state in ("stopped", "stopping"):
                slot.unloading = False
            if slot.state != "stopped" or self._pending.get(name, now) < now:
                self._pending.pop(name, None)
        for gone in set(self.slots) - set(servers):
            del self.slots[gone]
        self.routes = routing_table(servers)

    async def poll_forever(self) -> None:
        while True:
            try:
                await self.refresh()
                await self._unload_idle()
            except DaemonGone as err:
                emit("gateway_daemon_unreachable", "warning", error=str(err))
                await asyncio.sleep(1.0)
            except Exception as err:  # the poller must outlive any surprise, or every view goes stale
                emit("gateway_poll_failed", "error", error=repr(err))
                await asyncio.sleep(1.0)
            await asyncio.sleep(POLL_WAITING_S if self._waiting else POLL_IDLE_S)

    def mark_unreachable(self, name: str) -> None:
        """A connection to `name` was refused: not ready, whatever the last view said, until the next one."""
        server = self.servers.get(name)
        if server is not None and server["state"] == "ready":
            self.view["servers"][name] = {**server, "state": "unreachable"}

    async def process_replaced(self, name: str, pid: int | None, within_s: float = 2.0) -> bool:
        """After a broken connection: did the worker `pid` exit (so a retry goes to a new one)?

        Asks the daemon until it reports the exit or `within_s` passes (the daemon learns of an exit
        within milliseconds; a worker that resets connections while alive is not retried).
        """
        until = self.clock() + within_s
        while True:
            with contextlib.suppress(DaemonGone):
                await self.refresh()
            server = self.servers.get(name) or {}
            if server.get("pid") != pid or server.get("state") != "ready":
                self.mark_unreachable(name)
                return True
            if self.clock() >= until:
                return False
            await asyncio.sleep(0.1)

    # ---- routing --------------------------------------------------------------------------
    def resolve(self, model: str) -> str | None:
        return self.routes.get(model)

    def model_names(self) -> list[str]:
        return sorted(self.routes)

    # ---- requests -------------------------------------------------------------------------
    def slot(self, name: str) -> Slot:
        return self.slots[name]

    def start_timeout_s(self) -> float:
        return float(self.settings.get("start_timeout_s") or DEFAULT_START_TIMEOUT_S)

    async def ensure_ready(self, name: str, deadline: float) -> None:
        """Return once `name` is ready; Unavailable if it cannot be by `deadline` (monotonic)."""
        if self.servers.get(name, {}).get("state") == "ready":
            return
        task = self._starts.get(name)
        if task is None or task.done():
            task = self._starts[name] = asyncio.ensure_future(self._bring_up(name))
        self._waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - self.clock()))
        except TimeoutError:
            state = self.servers.get(name, {}).get("state", "unknown")
            raise Unavailable(
                f"server '{name}' is not ready yet (state {state}); retry later", retry_after_s=5, state=state
            ) from None
        finally:
            self._waiting -= 1

    async def _bring_up(self, name: str) -> None:
        """Start `name` if it is a stopped on-demand server, then wait until the view shows it ready."""
        server = self.servers.get(name) or {}
        if server.get("state") == "stopped" and not self.start_pending(name):
            await self.admit_and_start(name)
        while True:
            server = self.servers.get(name)
            if server is None:
                raise Unavailable(f"server '{name}' was removed from the config")
            state = server["state"]
            if state == "ready":
                return
            if state == "fatal":
                raise Unavailable(
                    f"server '{name}' failed and is stopped (fatal): {server.get('fatal_reason')}", state=state
                )
            if state == "waiting":  # a condition of the world (port taken, model not there): say it now
                raise Unavailable(
                    f"server '{name}' is waiting: {server.get('waiting_reason')}; retry later",
                    retry_after_s=5,
                    state=state,
                )
            if state == "stopped" and not self.start_pending(name):
                if server.get("start") != "on_demand":
                    raise Unavailable(f"server '{name}' is stopped", retry_after_s=5, state=state)
                await self.admit_and_start(name)  # unloaded meanwhile: start it again
            await self._refreshed.wait()

    async def admit_and_start(self, name: str) -> dict[str, Any]:
        """Admission, then the daemon's start (its answer); Unavailable when refused."""
        async with self._admission:  # one admission at a time: each sees the others' starts
            server = self.servers[name]
            need = server.get("need") or 0
            decision = admission.admit(name, need, self.residents(), self.view.get("budget"))
            if isinstance(decision, admission.Refuse):
                self.tally.refused(name)
                emit(
                    "admission_refused",
                    "warning",
                    server=name,
                    need=decision.need,
                    budget=decision.budget,
                    in_use=decision.in_use,
                    reason=decision.reason,
                )
                raise Unavailable(
                    decision.message(name), need=decision.need, budget=decision.budget, in_use=decision.in_use
                )
            for victim in decision.unload:
                self.slots[victim].unloading = True
            answer = await self.link.start(name, decision.unload)
            if not answer.get("ok"):
                raise Unavailable(f"server '{name}' cannot start: {answer.get('error')}")
            if not answer.get("already"):  # the daemon began this start (and these stops) for us
                self.tally.admitted(name)
                for victim in decision.unload:
                    self.tally.unloaded(victim, "admission")
            if answer.get("state") in ("stopped", "stopping"):  # stops first (victims, an unload); the start follows
                self._pending[name] = self.clock() + self.start_timeout_s()
            return answer

    def start_pending(self, name: str) -> bool:
        """A start was asked for and the daemon stops the admission's victims first."""
        return name in self._pending

    def residents(self) -> list[admission.Resident]:
        """Every server holding memory (not stopped, or about to start), with the gateway's usage facts."""
        out = []
        for name, server in self.servers.items():
            if server["state"] == "stopped" and name not in self._pending:
                continue
            slot = self.slots.get(name)
            out.append(
                admission.Resident(
                    name=name,
                    need=int(server.get("need") or 0),
                    on_demand=server.get("start") == "on_demand",
                    busy=bool(slot and slot.in_flight) or name in self._pending or name in self._active_starts(),
                    last_used=slot.last_used if slot else 0.0,
                    idle_unload_s=server.get("idle_unload_s"),
                )
            )
        return out

    def _active_starts(self) -> set[str]:
        return {n for n, t in self._starts.items() if not t.done()}

    async def _unload_idle(self) -> None:
        ready = [
            r for r in self.residents() if self.servers[r.name]["state"] == "ready" and not self.slots[r.name].unloading
        ]
        for name in admission.idle(ready, self.clock()):
            self.slots[name].unloading = True
            answer = await self.link.unload(name, "idle")
            if not answer.get("ok"):
                emit("gateway_unload_failed", "warning", server=name, error=answer.get("error"))
            elif not answer.get("already"):
                self.tally.unloaded(name, "idle")


def routing_table(servers: dict[str, Any]) -> dict[str, str]:
    """Model names clients may send: entry names, then aliases, then HF ids / model paths used by one entry only."""
    routes = {name: name for name in servers}
    for name, server in servers.items():
        for alias in server.get("aliases") or ():
            routes.setdefault(alias, name)
    by_model: dict[str, list[str]] = {}
    for name, server in servers.items():
        model = server["model"]
        ids = [model, os.path.basename(model.rstrip("/"))] if model.startswith("/") else [model]
        for model_id in ids:
            by_model.setdefault(model_id, []).append(name)
    for model, names in by_model.items():
        if len(names) == 1:
            routes.setdefault(model, names[0])
    return routes
