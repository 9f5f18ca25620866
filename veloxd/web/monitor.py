"""What the dashboard and /metrics show, sampled every `interval_s` in the web process.

One sample: the daemon's state (control socket `status`), each ready worker's request counters
(`GET /veloxd/stats` on its port), each worker's resident memory (psutil, its whole process
tree), and tokens per second from the counters' change since the previous sample. New log
events arrive through the control socket's `events` command. Samples and events go to the
subscribers of the live stream (server-sent events); the last `history` samples feed the charts.
Everything runs on the web process's event loop, talking to the daemon through its async client
(veloxd/daemon/client.py; in the gateway process, the one the gateway uses too).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

import aiohttp
import psutil

from veloxd.daemon.client import DaemonClient
from veloxd.daemon.console import summary_text
from veloxd.daemon.control import DaemonUnreachable
from veloxd.daemon.state import ServerState
from veloxd.endpoints import connect_host
from veloxd.serve.stats import STATS_PATH
from veloxd.web.memory_view import memory_view

LOG_KEEP = 2000  # events kept for the log tail of a newly opened page
STATS_TIMEOUT_S = 2.0


def resident_bytes(pid: int) -> int | None:
    """Resident memory of `pid` and all its descendants (a worker's whole tree), or None if gone."""
    try:
        root = psutil.Process(pid)
        total = root.memory_info().rss
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return int(total)
    except psutil.Error:
        return None


def _seconds_since(stamp: Any, now: float) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return max(0.0, now - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def _bearer(entry: dict[str, Any]) -> str | None:
    """The token a worker with `api_key_env` expects: from its `env:` or the environment."""
    name = entry.get("api_key_env")
    if not name:
        return None
    return (entry.get("env") or {}).get(name) or os.environ.get(name)


class Monitor:
    """Latest sample, chart history and recent log events of one daemon; pushes changes to subscribers."""

    def __init__(
        self, client: DaemonClient, interval_s: float = 1.0, history: int = 900, clock: Callable[[], float] = time.time
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.clock = clock
        self.state: dict[str, Any] = {}  # the daemon's status answer
        self.servers: dict[str, dict[str, Any]] = {}  # per server: what the page and /metrics show
        self.stats: dict[str, dict[str, Any]] = {}  # per server: the worker's /veloxd/stats answer
        self.reachable = False
        self.error: str | None = None
        self.sampled_at = 0.0
        self.history: deque[dict[str, Any]] = deque(maxlen=history)
        self.logs: deque[dict[str, Any]] = deque(maxlen=LOG_KEEP)
        self._log_seq = 0
        self._previous: dict[str, tuple[float, int, int | None]] = {}  # name -> (time, tokens, pid)
        self._subscribers: set[asyncio.Queue[tuple[str, Any]]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # ---- lifecycle (aiohttp on_startup / on_cleanup) ---------------------------------------
    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S))
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="veloxd-monitor")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()
        for queue in list(self._subscribers):
            queue.put_nowait(("close", None))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()

    # ---- sampling ---------------------------------------------------------------------------
    async def refresh(self, max_age_s: float = 0.0) -> None:
        """Take a sample now (unless the last one is younger than `max_age_s`) and publish it."""
        async with self._lock:
            if max_age_s and self.clock() - self.sampled_at < max_age_s:
                return
            await self._sample()

    async def _sample(self) -> None:
        now = self.clock()
        try:
            answer = await self.client.ask({"command": "status"})
            events = await self.client.ask({"command": "events", "after": self._log_seq, "limit": LOG_KEEP})
        except (DaemonUnreachable, OSError, ValueError) as err:
            self.reachable, self.error = False, str(err)
            self.servers, self.stats, self._previous = {}, {}, {}  # nothing stale in /metrics
            self.sampled_at = now
            self._publish("state", self.page_state())
            return
        self.reachable, self.error = bool(answer.get("ok")), answer.get("error")
        self.state = answer.get("state") or {}
        await self._collect_servers(now)
        self.sampled_at = now
        point = {
            "t": round(now, 3),
            "servers": {name: {"rss": s["rss_bytes"], "tps": s["tokens_per_s"]} for name, s in self.servers.items()},
        }
        self.history.append(point)
        new_events = events.get("events") or []
        for event in new_events:
            event["text"] = summary_text(event)
        if events.get("last_seq", 0) < self._log_seq:  # a new daemon numbers from 1 again
            self.logs.clear()
        self._log_seq = events.get("last_seq", self._log_seq)
        self.logs.extend(new_events)
        self._publish("state", {**self.page_state(), "point": point})
        if new_events:
            self._publish("logs", new_events)

    async def _collect_servers(self, now: float) -> None:
        snapshots: dict[str, Any] = self.state.get("servers") or {}
        config = ((self.state.get("config") or {}).get("servers")) or {}
        names = list(snapshots)
        stats = await asyncio.gather(*(self._worker_stats(snapshots[n], config.get(n) or {}) for n in names))
        servers: dict[str, dict[str, Any]] = {}
        for name, worker_stats in zip(names, stats):
            snap, entry = snapshots[name], config.get(name) or {}
            if worker_stats is not None:
                self.stats[name] = worker_stats
            elif snap.get("state") != ServerState.READY.value:
                self.stats.pop(name, None)
            servers[name] = self._server_view(name, snap, entry, self.stats.get(name), now)
        for gone in set(self._previous) - set(servers):
            self._previous.pop(gone, None)
            self.stats.pop(gone, None)
        self.servers = servers

    async def _worker_stats(self, snap: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
        if snap.get("state") != ServerState.READY.value or self._session is None:
            return None
        host = connect_host(snap.get("host", "127.0.0.1"))
        shown = f"[{host}]" if ":" in host else host
        token = _bearer(entry)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._session.get(f"http://{shown}:{snap['port']}{STATS_PATH}", headers=headers) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _server_view(
        self, name: str, snap: dict[str, Any], entry: dict[str, Any], stats: dict[str, Any] | None, now: float
    ) -> dict[str, Any]:
        ready = snap.get("ready") or {}
        kv = ready.get("kv_bytes_per_token") or {}
        pid = snap.get("pid")
        rss = resident_bytes(pid) if isinstance(pid, int) else None
        tokens = int(stats.get("generated_tokens", 0)) if stats else None
        tps = None
        if tokens is not None:
            before = self._previous.get(name)
            if before is not None and before[2] == pid and tokens >= before[1] and now > before[0]:
                tps = round((tokens - before[1]) / (now - before[0]), 3)
            self._previous[name] = (now, tokens, pid)
        state = snap.get("state")
        return {
            "name": name,
            "state": state,
            "pid": pid,
            "host": snap.get("host"),
            "port": snap.get("port"),
            "model": snap.get("model"),
            "method": snap.get("method"),
            "bits": ready.get("bits", entry.get("bits")),
            "description": entry.get("description") or "",
            "start": entry.get("start") or "always",  # on_demand: the gateway's page offers start / unload
            "kv_ratio": kv.get("ratio"),
            "kv_ratio_tokens": kv.get("tokens"),  # the length the ratio of totals is taken at
            "kv_cap_tokens": kv.get("cap_tokens"),  # an evicting cache: its per-token figure holds below this
            "kv_capped_bytes": kv.get("capped_bytes"),
            "kv_bytes_per_token": kv.get("method"),
            "fp16_bytes_per_token": kv.get("fp16"),
            "rss_bytes": rss,
            "since": snap.get("since"),
            "uptime_s": _seconds_since(snap.get("since"), now) if state == ServerState.READY.value else None,
            "startup_s": snap.get("startup_s"),
            "restarts": snap.get("restarts", 0),
            "starts": snap.get("starts"),
            "on_demand_starts": snap.get("on_demand_starts"),
            "failures": snap.get("failures", 0),
            "last_error": snap.get("last_error") or snap.get("fatal_reason"),
            "last_error_at": snap.get("last_error_at"),  # the page says when: a ready server keeps its last error
            "download": snap.get("download"),  # while downloading: bytes, percent, rate, ETA
            "requests": sum((stats or {}).get("requests", {}).values()) if stats else None,
            "in_flight": stats.get("in_flight") if stats else None,
            "queued": stats.get("queued") if stats else None,
            "generated_tokens": tokens,
            "tokens_per_s": tps,
        }

    # ---- what the page reads ----------------------------------------------------------------
    def page_state(self) -> dict[str, Any]:
        daemon = self.state.get("daemon") or {}
        return {
            "reachable": self.reachable,
            "error": self.error,
            "time": self.sampled_at,
            "daemon": {key: daemon.get(key) for key in ("pid", "version", "running", "stopping")},
            "config_path": self.state.get("config_path"),
            "degraded": self.state.get("degraded"),
            "last_reload": self.state.get("last_reload"),
            "servers": list(self.servers.values()),
            "memory": memory_view(self.state.get("memory"), self.servers),  # None without a gateway
        }

    def log_tail(self, server: str | None = None, text: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """The recent events, optionally one server's and/or those whose line or event contains `text`."""
        needle = (text or "").lower()
        out = [
            e
            for e in self.logs
            if (server is None or e.get("server") == server) and (not needle or needle in event_text(e).lower())
        ]
        return out[-limit:] if limit > 0 else []

    # ---- live stream ------------------------------------------------------------------------
    def subscribe(self) -> asyncio.Queue[tuple[str, Any]]:
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=256)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        self._subscribers.discard(queue)

    def _publish(self, kind: str, data: Any) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait((kind, data))
            except asyncio.QueueFull:  # a stalled page: drop it; its EventSource reconnects and reloads
                self._subscribers.discard(queue)
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(("close", None))


def event_text(event: dict[str, Any]) -> str:
    """What the log tail shows of an event (and what its filter matches): as on the console."""
    name = "" if event.get("event") == "server_output" else f"{event.get('event', '')} "
    return f"{event.get('server') or ''} {name}{event.get('text') or summary_text(event)}".strip()
