"""The servers as the gateway sees them: the daemon's view, routing names, and readiness on demand.

One asyncio task follows the daemon's view as a long poll (`follow_view`: the daemon answers
when its view differs from the one held, veloxd/daemon/longpoll.py); another unloads idle
on-demand servers (veloxd/gateway/idle.py). `ensure_ready(name)` makes a
request wait until its server is ready: the first request for a stopped on-demand server runs
admission and asks the daemon to start it; every concurrent request for it awaits that same
start, and all wake on the view that shows it ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veloxd.daemon.client import DaemonClient
from veloxd.daemon.control import DaemonUnreachable
from veloxd.daemon.longpoll import MAX_WAIT_S
from veloxd.daemon.state import ServerState
from veloxd.gateway import admission
from veloxd.gateway.events import emit
from veloxd.gateway.limits import setting
from veloxd.gateway.routing import routing_table
from veloxd.gateway.tally import GatewayTally

VIEW_WAIT_S = MAX_WAIT_S  # one long poll; the daemon answers sooner when its view changes
RETRY_S = 1.0  # after the daemon could not be reached or refused to hold a view request
# The gateway's own state beside the daemon's (ServerState values, as its view carries them): a ready
# server that refused a connection, until the next view.
UNREACHABLE = "unreachable"


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
    state: str = ServerState.STOPPED.value
    unloading: bool = False


class Fleet:
    def __init__(self, daemon: DaemonClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.daemon = daemon
        self.clock = clock
        self.view: dict[str, Any] = {"servers": {}, "gateway": None, "budget": None}
        self.etag: str | None = None  # the daemon's name for `view` (None: ours differs from every one)
        self.slots: dict[str, Slot] = {}
        self.routes: dict[str, str] = {}  # model name a client may send -> entry name
        self._refreshed = asyncio.Event()
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._pending: dict[str, float] = {}  # start requested (until when we count on it), not yet in the view
        self._admission = asyncio.Lock()
        self.usage_changed = asyncio.Event()  # a request ended or the view changed: idle times move
        self._recheck: asyncio.Task[None] | None = None
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

    async def refresh(self, wait_s: float = 0.0) -> dict[str, Any]:
        """Take the daemon's view now, or with `wait_s` the next one unlike ours (at most that late)."""
        answer = await self.daemon.view(self.etag if wait_s else None, wait_s)
        if answer.get("ok"):
            self.etag = answer.get("etag")
            self._apply(answer)
        event, self._refreshed = self._refreshed, asyncio.Event()
        event.set()  # wakes everyone waiting for a newer view
        return answer

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
            if server["state"] != slot.state and server["state"] in (
                ServerState.STARTING.value,
                ServerState.READY.value,
            ):
                slot.last_used = max(slot.last_used, now)  # idle time counts from the (re)start
            slot.state = server["state"]
            if slot.state in (ServerState.STOPPED.value, ServerState.STOPPING.value):
                slot.unloading = False
            if slot.state != ServerState.STOPPED.value or self._pending.get(name, now) < now:
                self._pending.pop(name, None)
        for gone in set(self.slots) - set(servers):
            del self.slots[gone]
        self.routes = routing_table(servers)
        self.usage_changed.set()

    async def follow_view(self) -> None:
        """Keep the view current: one long poll after another, each answered by the daemon's next view."""
        while True:
            try:
                answer = await self.refresh(VIEW_WAIT_S)
                if answer.get("ok"):
                    continue
                emit("gateway_view_refused", "warning", error=answer.get("error"))
            except DaemonUnreachable as err:
                emit("gateway_daemon_unreachable", "warning", error=str(err))
            except Exception as err:  # the follower must outlive any surprise, or every view goes stale
                emit("gateway_poll_failed", "error", error=repr(err))
            await asyncio.sleep(RETRY_S)

    def mark_unreachable(self, name: str) -> None:
        """A connection to `name` was refused: not ready, whatever the last view said, until the next
        one, which is asked for at once (the daemon's view may not change: a worker alive but refusing)."""
        server = self.servers.get(name)
        if server is not None and server["state"] == ServerState.READY.value:
            self.view["servers"][name] = {**server, "state": UNREACHABLE}
            self.etag = None
            if self._recheck is None or self._recheck.done():
                self._recheck = asyncio.ensure_future(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(DaemonUnreachable):  # the follower reports it
            await self.refresh()

    # ---- routing --------------------------------------------------------------------------
    def resolve(self, model: str) -> str | None:
        return self.routes.get(model)

    def model_names(self) -> list[str]:
        return sorted(self.routes)

    # ---- requests -------------------------------------------------------------------------
    def slot(self, name: str) -> Slot:
        return self.slots[name]

    def release(self, slot: Slot) -> None:
        """A request for `slot`'s server ended: its idle time counts from now."""
        slot.in_flight -= 1
        slot.last_used = self.clock()
        self.usage_changed.set()

    def start_timeout_s(self) -> float:
        return float(setting(self.settings, "start_timeout_s"))

    async def ensure_ready(self, name: str, deadline: float) -> None:
        """Return once `name` is ready; Unavailable if it cannot be by `deadline` (monotonic)."""
        if self.servers.get(name, {}).get("state") == ServerState.READY.value:
            return
        task = self._starts.get(name)
        if task is None or task.done():
            task = self._starts[name] = asyncio.ensure_future(self._bring_up(name))
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - self.clock()))
        except TimeoutError:
            state = self.servers.get(name, {}).get("state", "unknown")
            raise Unavailable(
                f"server '{name}' is not ready yet (state {state}); retry later", retry_after_s=5, state=state
            ) from None

    async def _bring_up(self, name: str) -> None:
        """Start `name` if it is a stopped on-demand server, then wait until the view shows it ready."""
        server = self.servers.get(name) or {}
        if server.get("state") == ServerState.STOPPED.value and not self.start_pending(name):
            await self.admit_and_start(name)
        while True:
            # Taken before any await below: a view that arrives while we ask the daemon to start wakes us.
            refreshed = self._refreshed
            server = self.servers.get(name)
            if server is None:
                raise Unavailable(f"server '{name}' was removed from the config")
            state = server["state"]
            if state == ServerState.READY.value:
                return
            if state == ServerState.FATAL.value:
                raise Unavailable(
                    f"server '{name}' failed and is stopped (fatal): {server.get('fatal_reason')}", state=state
                )
            if state == ServerState.WAITING.value:  # a condition of the world (port taken, no model): say it now
                raise Unavailable(
                    f"server '{name}' is waiting: {server.get('waiting_reason')}; retry later",
                    retry_after_s=5,
                    state=state,
                )
            if state == ServerState.STOPPED.value and not self.start_pending(name):
                if server.get("start") != "on_demand":
                    raise Unavailable(f"server '{name}' is stopped", retry_after_s=5, state=state)
                await self.admit_and_start(name)  # unloaded meanwhile: start it again
            await refreshed.wait()

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
                    kept=decision.kept,
                    reason=decision.reason,
                )
                raise Unavailable(
                    decision.message(name),
                    need=decision.need,
                    budget=decision.budget,
                    in_use=decision.in_use,
                    kept=decision.kept,
                )
            for victim in decision.unload:
                self.slots[victim].unloading = True
            answer = await self.daemon.start(name, decision.unload)
            if not answer.get("ok"):
                raise Unavailable(f"server '{name}' cannot start: {answer.get('error')}")
            if not answer.get("already"):  # the daemon began this start (and these stops) for us
                self.tally.admitted(name)
                for victim in decision.unload:
                    self.tally.unloaded(victim, "admission")
            # Stops first (victims, an unload); the start follows.
            if answer.get("state") in (ServerState.STOPPED.value, ServerState.STOPPING.value):
                self._pending[name] = self.clock() + self.start_timeout_s()
            return answer

    def start_pending(self, name: str) -> bool:
        """A start was asked for and the daemon stops the admission's victims first."""
        return name in self._pending

    def residents(self) -> list[admission.Resident]:
        """Every server holding memory (not stopped, or about to start), with the gateway's usage facts."""
        out = []
        for name, server in self.servers.items():
            if server["state"] == ServerState.STOPPED.value and name not in self._pending:
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
