"""The set of supervised servers, and applying a reload plan to it in the right order.

A plan is applied as a rollout: stop removed and changed servers first and wait until they
have exited (ports and unified memory are free again), then start changed and added ones.
Unchanged servers are not touched; live-only updates replace the entry without a restart.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from veloxd import protocol
from veloxd.daemon import messages as m
from veloxd.daemon.download import download_command, worker_hub_env
from veloxd.daemon.probe import health_error, wait_healthy
from veloxd.daemon.process import Child, Lifeline, worker_env
from veloxd.daemon.server import ServerProcess
from veloxd.daemon.state import ServerState
from veloxd.distributed.command import group_argv, split_rank
from veloxd.download.protocol import parse_line


class WorkerSpawner:
    """Spawns `<worker command> <entry flags> --lifeline-fd N`; reports go to the loop's queue."""

    def __init__(
        self,
        command: Sequence[str],
        lifeline: Lifeline,
        inbox: queue.SimpleQueue[Any],
        log: Any,
        env: dict[str, str] | None = None,
        event_log: Any = None,
    ):
        self.command = list(command)
        self._lifeline = lifeline
        self._inbox = inbox
        self._log = log
        self._env = env or {}
        self._event_log = event_log or log

    def argv(self, entry: Any) -> list[str]:
        if getattr(entry, "distributed", None) is not None:  # one group process: MLX's launcher and its ranks
            return group_argv(entry, self.command, self._lifeline.read_fd)
        program = getattr(entry, "program", None) or self.command  # the gateway is its own program
        return [*program, *entry.serve_argv(), protocol.LIFELINE_FLAG, str(self._lifeline.read_fd)]

    def spawn(self, name: str, spawn_id: int, entry: Any) -> Child:
        inbox, log, event_log = self._inbox, self._log.bind(server=name), self._event_log
        grouped = getattr(entry, "distributed", None) is not None

        def on_line(pid: int, stream: str, line: str) -> None:
            if stream == "stdout" and line.startswith(protocol.EVENT_PREFIX):
                try:
                    record = json.loads(line[len(protocol.EVENT_PREFIX) :])
                    event, level = str(record.pop("event")), str(record.pop("level", "info"))
                    getattr(event_log, level if level in ("info", "warning", "error") else "info")(event, **record)
                    return
                except (ValueError, KeyError, AttributeError, TypeError):
                    pass  # not an event after all: logged as output below
            if grouped:  # `[rank N] ...` from a rank; untagged lines are the launcher's own (rank null)
                rank, line = split_rank(line)
                log.info("server_output", pid=pid, rank=rank, stream=stream, line=line)
                if rank != 0:
                    return
            else:
                log.info("server_output", pid=pid, stream=stream, line=line)
            if stream == "stdout" and protocol.is_ready_line(line):
                try:
                    inbox.put(m.ReadyLine(name, spawn_id, dict(protocol.parse_ready(line))))
                except protocol.ProtocolError as err:
                    inbox.put(m.ReadyLine(name, spawn_id, {"raw": line[len(protocol.READY_PREFIX) :]}, str(err)))

        def on_exit(returncode: int) -> None:
            inbox.put(m.ChildExited(name, spawn_id, returncode))

        env = worker_env({**entry.env, **worker_hub_env(entry.model), **self._env})
        return Child(self.argv(entry), env, self._lifeline, on_line, on_exit, scrub=_scrubber(entry, env), held=True)

    def spawn_download(self, name: str, spawn_id: int, entry: Any) -> Child:
        """The entry's download step: its progress lines become messages, its other lines are logged."""
        inbox, log = self._inbox, self._log.bind(server=name)

        def on_line(pid: int, stream: str, line: str) -> None:
            payload = parse_line(line) if stream == "stdout" else None
            if payload is None:
                log.info("server_output", pid=pid, stream=stream, line=line)
            else:
                inbox.put(m.DownloadLine(name, spawn_id, payload))

        def on_exit(returncode: int) -> None:
            inbox.put(m.ChildExited(name, spawn_id, returncode))

        argv = download_command(entry.model, self._lifeline.read_fd)
        return Child(argv, worker_env(entry.env), self._lifeline, on_line, on_exit, held=True)

    def probe_health(self, name: str, spawn_id: int, host: str, port: int, deadline: float) -> threading.Event:
        cancel = threading.Event()

        def run() -> None:
            if wait_healthy(host, port, deadline, cancel):
                self._inbox.put(m.Healthy(name, spawn_id))

        threading.Thread(target=run, name=f"health-{name}", daemon=True).start()
        return cancel

    def check_health(self, name: str, spawn_id: int, sequence: int, host: str, port: int, timeout: float) -> None:
        """One liveness probe on its own thread (it may wait out `timeout`); its outcome becomes a message."""

        def run() -> None:
            self._inbox.put(m.HealthProbed(name, spawn_id, sequence, health_error(host, port, timeout)))

        threading.Thread(target=run, name=f"liveness-{name}", daemon=True).start()


def _scrubber(entry: Any, env: Mapping[str, str]) -> Callable[[str], str] | None:
    """Removes the entry's secret values (its api_key_env's, secret-looking env keys') from output lines."""
    from veloxd.config.secrets import is_secret_name, redact_text

    secrets = [value for name, value in getattr(entry, "env", {}).items() if is_secret_name(name)]
    api_key_env = getattr(entry, "api_key_env", None)  # the gateway's and dashboard's entries may have none
    if api_key_env and env.get(api_key_env):
        secrets.append(env[api_key_env])
    if not secrets:
        return None
    return lambda line: redact_text(line, secrets)


@dataclass
class Rollout:
    """Stop these servers, wait until all are STOPPED, drop `remove`, then start `start`."""

    stop: set[str]
    start: dict[str, Any]  # name -> entry to start with (None: its current entry, if it still exists)
    remove: set[str] = field(default_factory=set)
    reason: str = "reload"
    stopping: bool = False  # stops issued (only the rollout at the head of the queue acts)


class Supervisor:
    """Owns one ServerProcess per entry name. Called only from the daemon's loop thread."""

    def __init__(self, spawner: WorkerSpawner, log: Any) -> None:
        self.servers: dict[str, ServerProcess] = {}
        self.rollouts: list[Rollout] = []
        self._spawner = spawner
        self._log = log

    # ---- plans --------------------------------------------------------------------------
    def apply(self, plan: Any, desired: Mapping[str, Any], now: float) -> None:
        """Apply a config plan: stop removed+changed, update live-only, then start changed+added.

        A FATAL server whose entry changed at all (even a live-only key such as a longer
        ready_timeout_s) is started again: the user has acted on it.
        """
        revived = [n for n in plan.updated if n in self.servers and self.servers[n].state is ServerState.FATAL]
        for name in plan.updated:
            if name in self.servers:
                self.servers[name].entry = desired[name]
                self.servers[name].recheck_soon(now)
        running = {n for n, s in self.servers.items() if s.state is not ServerState.STOPPED}
        candidates = [*plan.changed, *revived, *plan.added]
        # An on_demand server starts only on its first request, or again if it was running when it changed;
        # one switched to `start: always` while stopped starts now.
        candidates += [n for n in plan.updated if n not in running and _start_mode(desired[n]) == "always"]
        to_start = {n: desired[n] for n in candidates if _start_mode(desired[n]) == "always" or n in running}
        for name in [*plan.added, *plan.changed]:
            if name not in to_start and name not in plan.removed:
                if name in self.servers:
                    self.servers[name].entry = desired[name]
                else:  # known (status, the gateway) but not started
                    self.servers[name] = ServerProcess(desired[name], self._spawner, self._log)
        stop = {*plan.removed, *plan.changed, *revived}
        self.begin(Rollout(stop=stop, start=to_start, remove=set(plan.removed)), now)

    def restart(self, names: Iterable[str], reason: str, now: float) -> None:
        """Stop and start these servers again (clearing their failure history)."""
        names = [n for n in names if n in self.servers]
        start = dict.fromkeys(names)
        self.begin(Rollout(stop=set(names), start=start, reason=reason), now)

    def model_changed(self, names: Iterable[str], present: bool, now: float) -> list[str]:
        """A local model path changed, appeared or vanished; returns the servers restarted.

        WAITING servers look again at once. While the path is missing, running servers keep
        serving what they loaded and only FATAL ones are restarted (into WAITING, visibly);
        once it is back, or its files changed, every other server using it restarts.
        """
        names = [n for n in names if n in self.servers]
        for name in names:
            self.servers[name].recheck_soon(now)
        movable = (ServerState.FATAL,) if not present else tuple(s for s in ServerState if s is not ServerState.WAITING)
        restart = [n for n in names if self.servers[n].state in movable]
        self.restart(restart, "model_changed", now)
        return restart

    def recheck_waiting(self, now: float) -> None:
        """`veloxd reload` of unchanged bytes: WAITING servers look at the world again now."""
        for server in self.servers.values():
            server.recheck_soon(now)

    def begin(self, rollout: Rollout, now: float) -> None:
        """Queue a rollout; rollouts run one after another so none undoes another's stop."""
        self.rollouts.append(rollout)
        self._advance(now)

    def stop_all(self, now: float) -> None:
        """Shutdown: every server to STOPPING at once (they stop in parallel); no more starts."""
        self.rollouts.clear()
        for server in self.servers.values():
            server.stop(now)

    @property
    def busy(self) -> bool:
        """A rollout is still waiting for servers to stop."""
        return bool(self.rollouts)

    def all_stopped(self) -> bool:
        return all(s.state is ServerState.STOPPED for s in self.servers.values())

    # ---- the loop's calls ----------------------------------------------------------------
    def on_message(
        self, msg: m.ChildExited | m.ReadyLine | m.DownloadLine | m.Healthy | m.HealthProbed, now: float
    ) -> None:
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
        else:
            server.on_healthy(msg.spawn_id, now)
        self._advance(now)

    def tick(self, now: float) -> None:
        for server in list(self.servers.values()):
            server.tick(now)
        self._advance(now)

    def next_deadline(self) -> float | None:
        deadlines = [d for s in self.servers.values() if (d := s.next_deadline()) is not None]
        return min(deadlines, default=None)

    def _advance(self, now: float) -> None:
        """Run the head rollout: issue its stops, and once all have stopped, its starts."""
        while self.rollouts:
            rollout = self.rollouts[0]
            if not rollout.stopping:
                rollout.stopping = True
                for name in rollout.stop:
                    if name in self.servers:
                        self.servers[name].stop(now)
            if any(
                self.servers[name].state is not ServerState.STOPPED for name in rollout.stop if name in self.servers
            ):
                return
            self.rollouts.pop(0)
            for name in rollout.remove:
                self.servers.pop(name, None)
            for name, entry in rollout.start.items():
                server = self.servers.get(name)
                if server is None:
                    if entry is None:
                        continue  # restarted, but removed by an earlier rollout
                    server = self.servers[name] = ServerProcess(entry, self._spawner, self._log)
                if server.state is not ServerState.STOPPED:
                    continue
                server.entry = entry or server.entry
                server.clear_failures()
                server.start(now)

    def snapshot(self) -> dict[str, Any]:
        """Each server's facts, with what a queued rollout will still do to it: a READY server whose
        restart waits behind another rollout is not settled, and status must not say it is."""
        pending = self.pending()
        return {
            name: {**server.snapshot(), "pending": pending.get(name)} for name, server in sorted(self.servers.items())
        }

    def pending(self) -> dict[str, str]:
        """name -> "restart", "stop" or "start": the first thing a queued rollout has yet to finish for it."""
        out: dict[str, str] = {}
        for rollout in self.rollouts:
            for name in sorted(rollout.stop | rollout.start.keys()):
                if name not in out:
                    stops, starts = name in rollout.stop, name in rollout.start
                    out[name] = "restart" if stops and starts else "stop" if stops else "start"
        return out


def _start_mode(entry: Any) -> str:
    return getattr(entry, "start", "always")
