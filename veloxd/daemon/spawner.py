"""Starting a supervised entry's processes (its worker, its download step) and its health probes.

Everything a child or a probe reports becomes a message on the loop's queue: ServerProcess
never sees a thread. One WorkerSpawner serves every entry; an entry's `program` (the gateway's
`veloxd gateway`, the dashboard's `veloxd web`) replaces the worker command.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from veloxd import protocol
from veloxd.daemon import messages as m
from veloxd.daemon.download import download_command, worker_hub_env
from veloxd.daemon.probe import health_error, wait_healthy
from veloxd.daemon.process import Child, Lifeline, worker_env
from veloxd.daemon.supervised import Supervised
from veloxd.distributed.command import group_argv, split_rank
from veloxd.download.protocol import parse_line

# The levels a child's VELOXD_EVENT line may carry, kept as they are (a debug event stays debug:
# the daemon's --log-level decides whether it is logged); anything else is logged as info.
EVENT_LEVELS = ("debug", "info", "warning", "error")


class Spawner(Protocol):
    """Starts workers and health probes whose reports reach the loop as messages.

    A spawned Child is held: its lines reach the log once release_output() is called, after the
    state event that names its pid, so a tailed log never shows a worker's output first."""

    def spawn(self, name: str, spawn_id: int, entry: Supervised) -> Child: ...

    def spawn_download(self, name: str, spawn_id: int, entry: Supervised) -> Child: ...

    def probe_health(self, name: str, spawn_id: int, host: str, port: int, deadline: float) -> threading.Event: ...

    def check_health(self, name: str, spawn_id: int, sequence: int, host: str, port: int, timeout: float) -> None: ...


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

    def argv(self, entry: Supervised) -> list[str]:
        if entry.distributed is not None:  # one group process: MLX's launcher and its ranks
            return group_argv(entry, self.command, self._lifeline.read_fd)
        program = self.command if entry.program is None else entry.program
        return [*program, *entry.serve_argv(), protocol.LIFELINE_FLAG, str(self._lifeline.read_fd)]

    def spawn(self, name: str, spawn_id: int, entry: Supervised) -> Child:
        inbox, log, event_log = self._inbox, self._log.bind(server=name), self._event_log
        grouped = entry.distributed is not None

        def on_line(pid: int, stream: str, line: str) -> None:
            if stream == "stdout" and line.startswith(protocol.EVENT_PREFIX):
                try:
                    record = json.loads(line[len(protocol.EVENT_PREFIX) :])
                    event, level = str(record.pop("event")), str(record.pop("level", "info"))
                    getattr(event_log, level if level in EVENT_LEVELS else "info")(event, **record)
                    return
                except (ValueError, KeyError, AttributeError, TypeError):
                    pass  # not an event after all: logged as output below
            if grouped:  # `[rank N] ...` from a rank; untagged lines are the launcher's own (rank null)
                rank, line = split_rank(line)
                _output(log, line, pid=pid, rank=rank, stream=stream)
                if rank != 0:
                    return
            else:
                _output(log, line, pid=pid, stream=stream)
            if stream == "stdout" and protocol.is_ready_line(line):
                try:
                    inbox.put(m.ReadyLine(name, spawn_id, dict(protocol.parse_ready(line))))
                except protocol.ProtocolError as err:
                    inbox.put(m.ReadyLine(name, spawn_id, {"raw": line[len(protocol.READY_PREFIX) :]}, str(err)))

        def on_exit(returncode: int) -> None:
            inbox.put(m.ChildExited(name, spawn_id, returncode))

        env = worker_env({**entry.env, **worker_hub_env(entry.model), **self._env})
        return Child(self.argv(entry), env, self._lifeline, on_line, on_exit, scrub=_scrubber(entry, env), held=True)

    def spawn_download(self, name: str, spawn_id: int, entry: Supervised) -> Child:
        """The entry's download step: its progress lines become messages, its other lines are logged."""
        inbox, log = self._inbox, self._log.bind(server=name)

        def on_line(pid: int, stream: str, line: str) -> None:
            payload = parse_line(line) if stream == "stdout" else None
            if payload is None:
                _output(log, line, pid=pid, stream=stream)
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


def _output(log: Any, line: str, **keys: Any) -> None:
    """One output line as `server_output`, at the level the line carries (a worker's WARNING is a warning)."""
    getattr(log, protocol.line_level(line))("server_output", **keys, line=line)


def _scrubber(entry: Supervised, env: Mapping[str, str]) -> Callable[[str], str] | None:
    """Removes the entry's secret values (its api_key_env's, secret-looking env keys') from output lines."""
    from veloxd.config.secrets import is_secret_name, redact_text

    secrets = [value for name, value in entry.env.items() if is_secret_name(name)]
    if entry.api_key_env and env.get(entry.api_key_env):
        secrets.append(env[entry.api_key_env])
    if not secrets:
        return None
    return lambda line: redact_text(line, secrets)
