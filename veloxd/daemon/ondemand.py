"""The daemon's side of the gateway: its view of the entries, start/unload requests, measured memory.

Runs on the daemon's loop thread only. The gateway decides (admission, idleness: pure functions
in veloxd.gateway.admission); this module carries out what it asks through the supervisor's
rollouts, so an admission's stops finish before its start, and a reload in progress is respected.
The view is a long poll (`views`, veloxd/daemon/longpoll.py): the loop calls `views.settle` once per
turn, so a gateway waiting for a change hears of it in the turn that made it.
Memory measurements from READY lines are remembered in `<state_dir>/measurements.json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from veloxd.daemon import messages as m
from veloxd.daemon.longpoll import ViewWaits
from veloxd.daemon.memory import (
    Need,
    budget_for,
    entry_need,
    kv_record,
    measurement_key,
    memory_table,
    read_measurements,
    save_measurements,
)
from veloxd.daemon.state import ServerState
from veloxd.daemon.supervisor import Rollout, Supervisor

S = ServerState


class OnDemand:
    def __init__(self, supervisor: Supervisor, state_dir: Path, log: Any) -> None:
        self.supervisor = supervisor
        self.config: Any = None
        self._state_dir = Path(state_dir)
        self._log = log
        self.measurements: dict[str, Any] = read_measurements(self._state_dir)
        self._needs: dict[tuple, Need] = {}
        self.views = ViewWaits(self.view)

    # ---- memory ---------------------------------------------------------------------------
    def need(self, entry: Any) -> Need:
        measured = self.measurements.get(measurement_key(entry.model, entry.method, entry.kv.bits))
        cache_key = (entry.model, entry.method, entry.kv.bits, entry.concurrency, json.dumps(measured, sort_keys=True))
        if cache_key not in self._needs:  # file sizes are read once per entry and measurement
            self._needs[cache_key] = entry_need(entry, measured)
        return self._needs[cache_key]

    def budget(self) -> int | None:
        return budget_for(self.config.gateway if self.config is not None else None, self.measurements)[0]

    def table(self) -> dict[str, Any]:
        """The memory table of `veloxd status`: every entry's need, the budget, what running entries use."""
        servers = self.config.servers if self.config is not None else {}
        states = {n: s.state.value for n, s in self.supervisor.servers.items()}
        budget, source = budget_for(self.config.gateway if self.config is not None else None, self.measurements)
        return memory_table(servers, states, self.need, budget, source)

    def on_ready_line(self, name: str, payload: dict[str, Any]) -> None:
        """Remember what READY measured (KV bytes per token, loaded weights) for this model and method."""
        server = self.supervisor.servers.get(name)
        if server is None or server.entry.kv is None:  # the gateway and the dashboard measure nothing
            return
        entry, bits = server.entry, server.entry.kv.bits
        kv = (payload.get("kv_bytes_per_token") or {}).get("method")
        memory = payload.get("memory") or {}
        record: dict[str, Any] = {"kv_bytes_per_token": kv, "weights_bytes": memory.get("weights_bytes")}
        record = {k: v for k, v in record.items() if isinstance(v, (int, float))}
        if isinstance(payload.get("kv_memory"), dict):
            record |= kv_record(payload["kv_memory"])
        key = measurement_key(entry.model, entry.method, bits)
        changed = self.measurements.get(key) != record
        if record and changed:
            self.measurements[key] = record
        working_set = memory.get("recommended_working_set_bytes")
        if isinstance(working_set, int) and working_set != self.measurements.get("recommended_working_set_bytes"):
            self.measurements["recommended_working_set_bytes"] = working_set
            changed = True
        if changed:
            save_measurements(self._state_dir, self.measurements)

    def report_overcommit(self) -> None:
        """At startup and reload: say so when the servers that always run do not fit the budget."""
        if self.config is None or self.config.gateway is None:
            return
        table = self.table()
        if table["always_over_budget"]:
            self._log.warning(
                "memory_overcommitted",
                budget=table["budget"],
                servers=table["always_over_budget"],
                needs={n: r["total"] for n, r in table["servers"].items() if r["start"] == "always"},
            )

    # ---- control requests -----------------------------------------------------------------
    def handle(self, msg: m.GatewayViewRequested | m.StartRequested | m.UnloadRequested, now: float) -> None:
        if isinstance(msg, m.GatewayViewRequested):
            self.views.ask(msg.reply, msg.known, msg.wait_s, now)
        elif isinstance(msg, m.StartRequested):
            msg.reply.send(self._start(msg.name, msg.unload, now))
        else:
            msg.reply.send(self._unload(msg.name, msg.reason, now))

    def view(self) -> dict[str, Any]:
        config = self.config
        if config is None:
            return {"config_sha256": None, "gateway": None, "budget": None, "servers": {}}
        servers = {}
        for name, entry in config.servers.items():
            server = self.supervisor.servers.get(name)
            where = server.entry if server is not None else entry  # a held restart's server still runs there
            servers[name] = {
                "state": server.state.value if server is not None else "stopped",
                "pid": server.pid if server is not None else None,
                "host": where.host,
                "port": where.port,
                "model": entry.model,
                "method": entry.method,
                "aliases": list(entry.aliases),
                "start": entry.start,
                "idle_unload_s": entry.idle_unload_s,
                "concurrency": entry.concurrency,
                "upstream_token": _token(entry),  # the socket is the user's only (0600)
                "need": self.need(entry).total,
                "fatal_reason": server.fatal_reason if server is not None else None,
                "waiting_reason": server.waiting_reason() if server is not None else None,
            }
        gateway = config.gateway.to_dict() if config.gateway is not None else None
        return {"config_sha256": config.sha256, "gateway": gateway, "budget": self.budget(), "servers": servers}

    def _problem(self, name: str) -> str | None:
        servers = self.config.servers if self.config is not None else {}
        if name not in servers or name not in self.supervisor.servers:
            return f"no server named {name!r} (servers: {', '.join(servers) or 'none'})"
        return None

    def _start(self, name: str, unload: tuple[str, ...], now: float) -> dict[str, Any]:
        problem = self._problem(name) or next(filter(None, (self._unloadable(n) for n in unload)), None)
        if problem:
            return {"ok": False, "error": problem}
        server = self.supervisor.servers[name]
        if server.state is S.FATAL:
            return {"ok": False, "error": f"server {name!r} is fatal: {server.fatal_reason}", "state": "fatal"}
        # A start asked while the server is still stopping (an unload a moment ago) is queued after
        # that stop; answering "already" would drop it, since stopping ends in STOPPED.
        if server.state not in (S.STOPPED, S.STOPPING) or any(name in r.start for r in self.supervisor.rollouts):
            return {"ok": True, "state": server.state.value, "already": True}
        self._log.info("server_start_requested", server=name, by="gateway", unload=list(unload))
        for victim in unload:
            self._log.info(
                "server_unloaded",
                server=victim,
                reason="admission",
                pid=self.supervisor.servers[victim].pid,
                for_server=name,
            )
        # A stopping server is in the stop set, so the start waits for its exit whatever stops it.
        stop = set(unload) | ({name} if server.state is S.STOPPING else set())
        server.start_on_demand()  # counted as a start, not a restart (RESTARTS, veloxd_server_restarts_total)
        self.supervisor.begin(Rollout(stop=stop, start={name: None}, reason="on_demand"), now)
        return {"ok": True, "state": server.state.value}

    def _unloadable(self, name: str) -> str | None:
        problem = self._problem(name)
        if problem is None and self.config.servers[name].start != "on_demand":
            problem = f"server {name!r} has start: always; only on_demand servers are unloaded"
        return problem

    def _unload(self, name: str, reason: str, now: float) -> dict[str, Any]:
        problem = self._unloadable(name)
        if problem:
            return {"ok": False, "error": problem}
        server = self.supervisor.servers[name]
        if server.state in (S.STOPPED, S.STOPPING):
            return {"ok": True, "state": server.state.value, "already": True}
        event = "server_idle_unloaded" if reason == "idle" else "server_unloaded"
        self._log.info(
            event, server=name, reason=reason, pid=server.pid, idle_unload_s=self.config.servers[name].idle_unload_s
        )
        self.supervisor.begin(Rollout(stop={name}, start={}, reason=reason), now)
        return {"ok": True, "state": server.state.value}


def _token(entry: Any) -> str | None:
    """The bearer token the worker expects (its api_key_env, from the entry's env or the daemon's)."""
    if not entry.api_key_env:
        return None
    return entry.env.get(entry.api_key_env) or os.environ.get(entry.api_key_env)
