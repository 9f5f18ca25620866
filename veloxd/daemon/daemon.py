"""`veloxd run`: the one thread that owns all state, and its loop.

Everything arrives as a message on one queue: signals, file events, child output/exits,
health probes, control requests. The loop handles one message, runs due timers (supervisor
ticks, debounced reloads, the slow config poll), writes the state file if it changed, repeat.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from veloxd import __version__, protocol
from veloxd.daemon import messages as m
from veloxd.daemon.control import ControlServer, remove_private_dir
from veloxd.daemon.logs import get_logger, reopen_logs, take_write_failure
from veloxd.daemon.models import ModelDirs
from veloxd.daemon.ondemand import OnDemand
from veloxd.daemon.orphans import end_orphans
from veloxd.daemon.process import Lifeline, process_start_time
from veloxd.daemon.reload import ConfigSource, Invalid, Unchanged, Valid
from veloxd.daemon.server import wall_clock
from veloxd.daemon.shutdown import forces_kill
from veloxd.daemon.sidecar import NAME as DASHBOARD
from veloxd.daemon.sidecar import DashboardSidecar, dashboard_snapshot
from veloxd.daemon.spawner import WorkerSpawner
from veloxd.daemon.statedir_guard import StateDirGuard
from veloxd.daemon.statefile import SCHEMA_VERSION, Changes, read_state
from veloxd.daemon.statewriter import LogFacts, StateWriter, log_facts
from veloxd.daemon.supervisor import Supervisor
from veloxd.daemon.watch import Debounce, Watcher, stat_signature
from veloxd.daemon.wrapper import check_lifeline_fd, watch_wrapper

POLL_S = 2.0  # backstop stat poll of the config (missed FSEvents, vanished directories)
DEBOUNCE_QUIET_S = 0.2
DEBOUNCE_MAX_S = 2.0


@dataclass(frozen=True)
class RunOptions:
    config_path: Path
    log_file: Path | None
    state_dir: Path
    worker_command: list[str] = field(default_factory=list)
    lifeline_fd: int | None = None  # stop when it reaches EOF (veloxd.daemon.wrapper)
    lock: IO[str] | None = None  # the state dir's held lock file (statefile.acquire_lock)


class Daemon:
    """Supervises one worker per config entry and follows the config file."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # put() is safe in signal handlers
        self.log = get_logger("veloxd.daemon")
        self.source = ConfigSource(options.config_path)
        self.config: Any = None
        self.last_reload: dict[str, Any] | None = None
        self._stopping = False
        self._stop_signal_at: float | None = None
        self._follow_up = False
        self._waiting_replies: list[m.Reply] = []
        self._config_debounce = Debounce(DEBOUNCE_QUIET_S, DEBOUNCE_MAX_S)
        self._file_changes = 0  # changes of the config seen since the last reload read it
        self.models = ModelDirs()
        self._config_sig = stat_signature(options.config_path)
        self._next_poll = 0.0
        self.changes = Changes()  # bumped wherever a fact of the state file changes
        self.state_writer = StateWriter(options.state_dir, self.changes, self.log)
        self._running = True
        self.step_failures = 0
        self._start_time = process_start_time(os.getpid())
        self._config_dict: tuple[Any, dict[str, Any] | None] = (None, None)

    # ---- lifecycle ------------------------------------------------------------------------
    def run(self) -> int:
        options = self.options
        if options.lifeline_fd is not None:
            check_lifeline_fd(options.lifeline_fd)  # StartupError: one line, exit 1
        previous = read_state(options.state_dir)
        self.control = ControlServer(options.state_dir, self.inbox)  # StartupError: one line, exit 1
        self.guard = StateDirGuard(options.state_dir, options.lock, self.control, self.changes, self.log)
        recorded = ((previous or {}).get("daemon") or {}).get("control_socket")
        if recorded and Path(recorded) != self.control.path:
            remove_private_dir(Path(recorded))  # an earlier daemon's, left by a crash
        end_orphans(previous, self.log)  # before any port is bound
        self.lifeline = Lifeline()
        spawner = WorkerSpawner(
            options.worker_command,
            self.lifeline,
            self.inbox,
            get_logger("veloxd.server"),
            env={
                protocol.CONTROL_SOCKET_ENV: str(self.control.path),
                protocol.STATE_DIR_ENV: str(Path(options.state_dir).resolve()),
            },
            event_log=get_logger("veloxd.gateway"),
        )
        self.supervisor = Supervisor(spawner, get_logger("veloxd.server"), self.changes)
        self.ondemand = OnDemand(self.supervisor, options.state_dir, get_logger("veloxd.server"))
        self.dashboard = DashboardSidecar(self.supervisor, options.state_dir)
        self.watcher = Watcher(options.config_path, self.inbox)
        self._install_signals()
        if options.lifeline_fd is not None:
            watch_wrapper(options.lifeline_fd, self.inbox)
        self.control.start()
        self.watcher.start()
        self.log.info(
            "daemon_started",
            pid=os.getpid(),
            version=__version__,
            config_path=str(options.config_path),
            log_file=str(options.log_file) if options.log_file else None,
            state_dir=str(options.state_dir),
            control_socket=str(self.control.path),
            worker_command=options.worker_command,
        )
        self._step("reload", self._reload, time.monotonic(), "startup")
        self._write_state()  # at once: `status` should not see the startup verdict late
        try:
            self._loop()
        finally:
            self.watcher.stop()
            self.control.close()
            self.lifeline.close()
        self._running = False
        self.changes.bump()
        self._write_state()
        self.log.info("daemon_stopped", pid=os.getpid())
        # Python resets its handlers to the default at exit: a wrapper's late copy of Ctrl-C would then
        # turn this clean exit into a death by SIGINT. Stopped is stopped; an ignored handler stays.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return 0

    def _install_signals(self) -> None:
        put = self.inbox.put
        signal.signal(signal.SIGTERM, lambda signum, frame: put(m.Shutdown(signum, time.monotonic())))
        signal.signal(signal.SIGINT, lambda signum, frame: put(m.Shutdown(signum, time.monotonic())))
        signal.signal(signal.SIGHUP, lambda signum, frame: put(m.ReloadRequested("sighup")))

    def _loop(self) -> None:
        while not (self._stopping and self.supervisor.all_stopped()):
            now = time.monotonic()
            try:
                message = self.inbox.get(timeout=max(0.0, self._next_wakeup(now) - now))
            except queue.Empty:
                message = None
            now = time.monotonic()
            if message is not None:
                self._step(type(message).__name__, self._handle, message, now, reply=getattr(message, "reply", None))
            self._step("timers", self._timers, now)
            # held gateway views: answered if this turn changed one
            self._step("views", self.ondemand.views.settle, now)
            self._step("state", self._write_state)

    def _step(self, what: str, step: Callable[..., None], *args: Any, reply: m.Reply | None = None) -> None:
        """One step of a turn of the loop. A bug in it is logged with its traceback and the daemon goes
        on: its exit would take every worker down with it (their lifelines close), and a good server
        must never pay for the daemon's own fault. `reply`: a waiting client gets an answer now."""
        try:
            step(*args)
        except Exception as err:
            self.step_failures += 1
            self.changes.bump()
            self.log.exception("daemon_step_failed", step=what, error=f"{type(err).__name__}: {err}")
            if reply is not None:
                reply.send({"ok": False, "error": f"the daemon failed ({type(err).__name__}: {err}); see its log"})

    def _next_wakeup(self, now: float) -> float:
        deadlines = [
            self._next_poll,
            self.supervisor.next_deadline(),
            self._config_debounce.deadline(),
            self.models.deadline(),
            self.ondemand.views.next_deadline(),
        ]
        return min((d for d in deadlines if d is not None), default=now + POLL_S)

    # ---- messages -------------------------------------------------------------------------
    def _handle(self, msg: Any, now: float) -> None:
        if isinstance(msg, m.ChildReport):
            self.supervisor.on_message(msg, now)
            if isinstance(msg, m.ReadyLine):
                self.ondemand.on_ready_line(msg.server, msg.payload)
                self.changes.bump()  # its measurements feed the memory table
        elif isinstance(msg, m.Shutdown):
            self._shutdown(msg.signum, msg.received_at, now)
        elif isinstance(msg, m.WrapperGone):
            if not self._stopping:  # already stopping (the wrapper's Ctrl-C, then its exit): nothing to add
                self.log.info("daemon_wrapper_gone", lifeline_fd=msg.fd)
                self._stop_signal_at = now  # a signal within REPEAT_WINDOW_S after this is the same request
                self._begin_stop(now, None, "wrapper_gone")
        elif isinstance(msg, m.StatusRequested):
            msg.reply.send({"ok": True, "state": self._state()})
        elif isinstance(msg, m.GatewayViewRequested):  # also while stopping: the gateway sees it
            self.ondemand.handle(msg, now)
        elif self._stopping:
            if getattr(msg, "reply", None) is not None:
                msg.reply.send({"ok": False, "error": "the daemon is stopping"})
        elif isinstance(msg, m.ConfigTouched):
            self._config_debounce.poke(now)
        elif isinstance(msg, m.ModelTouched):
            self.models.touched(msg.directory, now)
        elif isinstance(msg, m.ReloadRequested):
            if msg.source == "sighup":  # newsyslog/logrotate convention: SIGHUP reopens the log too
                self._reopen_logs("sighup")
            self._request_reload(now, msg.source, msg.reply)
        elif isinstance(msg, m.RestartRequested):
            self._restart(msg, now)
        elif isinstance(msg, (m.StartRequested, m.UnloadRequested)):
            self.ondemand.handle(msg, now)

    def _shutdown(self, signum: int, received_at: float, now: float) -> None:
        if self._stopping:  # a second signal: do not wait for the grace periods
            name = signal.Signals(signum).name
            since_first_s = None if self._stop_signal_at is None else round(received_at - self._stop_signal_at, 3)
            if not forces_kill(self._stop_signal_at, received_at):  # the same Ctrl-C, forwarded by a wrapper
                self.log.info("daemon_signal_merged", signal=name, since_first_s=since_first_s)
                return
            self.log.warning("daemon_kill_forced", signal=name, since_first_s=since_first_s)
            for server in self.supervisor.servers.values():
                server.kill_now()
            return
        self._stop_signal_at = received_at
        self._begin_stop(now, signal.Signals(signum).name, "signal")

    def _begin_stop(self, now: float, signal_name: str | None, cause: str) -> None:
        """Stop every server, then the loop ends; `cause` is "signal" or "wrapper_gone"."""
        self._stopping = True
        self.changes.bump()
        self.log.info("daemon_stopping", pid=os.getpid(), signal=signal_name, cause=cause)
        self.supervisor.stop_all(now)
        for reply in self._waiting_replies:
            reply.send({"ok": False, "error": "the daemon is stopping"})
        self._waiting_replies.clear()

    def _restart(self, msg: m.RestartRequested, now: float) -> None:
        if msg.name not in self.supervisor.servers:
            known = ", ".join(sorted(self.supervisor.servers)) or "none"
            if msg.reply:
                msg.reply.send({"ok": False, "error": f"no server named {msg.name!r} (servers: {known})"})
            return
        self.log.info("server_restart_requested", server=msg.name, pid=self.supervisor.servers[msg.name].pid)
        self.supervisor.restart([msg.name], "restart_requested", now)
        if msg.reply:
            msg.reply.send({"ok": True, "restarting": msg.name})

    def _reopen_logs(self, reason: str) -> None:
        for path in reopen_logs():
            self.log.info("log_reopened", log_file=path, reason=reason)

    # ---- timers ---------------------------------------------------------------------------
    def _timers(self, now: float) -> None:
        failure = take_write_failure()
        if failure is not None:  # lost from the file, but seen on the console, the dashboard and in status
            self.log.error("log_write_failed", **failure)
        self.supervisor.tick(now)
        if self._stopping:
            return
        if now >= self._next_poll:
            self._next_poll = now + POLL_S
            self.watcher.ensure_config_watch()
            self.watcher.sync_models()
            self.guard.check()  # state dir, lock file, control socket: made again if removed
            signature = stat_signature(self.options.config_path)
            if signature != self._config_sig:
                self._config_sig = signature
                self._config_debounce.poke(now)
        if self._config_debounce.due(now):
            self._file_changes += self._config_debounce.clear()
            self._request_reload(now, "watch", None)
        if self._follow_up and not self.supervisor.busy:
            self._follow_up = False
            self._reload(now, "follow_up")
        for path, names, present in self.models.changed(now):
            restarted = self.supervisor.model_changed(names, present, now)
            self.log.info("model_changed", directory=path, present=present, servers=names, restarted=restarted)

    def _request_reload(self, now: float, source: str, reply: m.Reply | None) -> None:
        """One reload at a time: while a plan is still being applied, coalesce into one follow-up."""
        if self.supervisor.busy:
            self._follow_up = True
            if reply is not None:
                self._waiting_replies.append(reply)
            return
        self._reload(now, source, reply)

    # ---- reload ---------------------------------------------------------------------------
    def _reload(self, now: float, source: str, reply: m.Reply | None = None) -> None:
        replies = [*self._waiting_replies, *([reply] if reply else [])]
        self._waiting_replies.clear()
        self._config_sig = stat_signature(self.options.config_path)
        outcome = self.source.read()
        changes, self._file_changes = self._file_changes, 0
        if isinstance(outcome, Unchanged):
            self.log.info("config_unchanged", source=source, file_changes=changes, config_sha256=outcome.sha256)
            self.supervisor.recheck_waiting(now)  # the file is the same; the world may not be
            answer: dict[str, Any] = {"ok": True, "unchanged": True, "config_sha256": outcome.sha256}
        elif isinstance(outcome, Invalid):
            answer = self._rejected(outcome, source, changes)
        else:
            answer = self._apply(outcome, source, now, changes)
        for waiting in replies:
            waiting.send(answer)

    def _rejected(self, outcome: Invalid, source: str, changes: int = 0) -> dict[str, Any]:
        """The file as it stands is what counts (docs/daemon.md): the versions a burst of edits went
        through are not read, and `file_changes` says how many this refusal stands for."""
        kept = self.config.sha256 if self.config is not None else None
        self.log.error(
            "config_reload_failed",
            source=source,
            file_changes=changes,
            config_path=str(self.source.path),
            config_sha256=outcome.sha256,
            kept_config_sha256=kept,
            errors=outcome.errors,
            error_lines=outcome.lines,
        )
        self.last_reload = {
            "ok": False,
            "at": wall_clock(),
            "source": source,
            "config_sha256": outcome.sha256,
            "kept_config_sha256": kept,
            "errors": outcome.lines,
            "file_changes": changes,
        }
        self.changes.bump()
        return {"ok": False, "errors": outcome.lines, "kept_config_sha256": kept}

    def _apply(self, outcome: Valid, source: str, now: float, changes: int = 0) -> dict[str, Any]:
        from veloxd.config.model import Config
        from veloxd.config.plan import diff

        new: Config = outcome.config  # typed: mypy checks its entries are Supervised
        plan = diff(self.config, new)
        first = self.config is None and source == "startup"
        summary = plan.to_dict()
        event = "config_loaded" if first else "config_reloaded"
        self.log.info(
            event,
            source=source,
            file_changes=changes,
            config_path=str(self.source.path),
            config_sha256=new.sha256,
            servers=list(new.servers),
            plan=summary,
        )
        self.config = self.ondemand.config = new
        self.supervisor.apply(plan, new.supervised(), now)
        self.ondemand.report_overcommit()
        self.dashboard.apply(new.dashboard, now)
        self.supervisor.recheck_waiting(now)  # whatever the plan, the world may have changed too
        self.watcher.set_model_dirs(self.models.update(new.servers))
        self.last_reload = {
            "ok": True,
            "at": wall_clock(),
            "source": source,
            "config_sha256": new.sha256,
            "plan": summary,
        }
        self.changes.bump()
        return {"ok": True, "config_sha256": new.sha256, "plan": summary}

    # ---- state file -----------------------------------------------------------------------
    def _state(self, facts: LogFacts | None = None) -> dict[str, Any]:
        options = self.options
        file_id, write_status = facts or log_facts()
        servers = self.supervisor.snapshot()
        dashboard = dashboard_snapshot(servers)
        servers.pop(DASHBOARD, None)
        return {
            "schema_version": SCHEMA_VERSION,
            "daemon": {
                "running": self._running,
                "pid": os.getpid(),
                "start_time": self._start_time,
                "version": __version__,
                "control_socket": str(self.control.path),
                "log_file": str(options.log_file) if options.log_file else None,
                "log_file_id": file_id,  # [device, inode] written to: `veloxd logs` compares
                "log_write": write_status,  # records the log file lost, and since when while it fails
                "state_write_error": self.state_writer.error,  # seen by `veloxd status` through the control socket
                "worker_command": options.worker_command,
                "stopping": self._stopping,
                "step_failures": self.step_failures,  # daemon_step_failed events: a bug to report
            },
            "config_path": str(options.config_path),
            "config": self._config_as_dict(),  # secrets redacted
            "config_sha256": self.config.sha256 if self.config is not None else None,
            "degraded": self.config is None,
            "last_reload": self.last_reload,
            "servers": servers,
            "dashboard": dashboard,
            "memory": self.ondemand.table() if self.config is not None and self.config.gateway is not None else None,
        }

    def _config_as_dict(self) -> dict[str, Any] | None:
        from veloxd.config.roundtrip import config_to_dict
        from veloxd.config.secrets import redact_config

        if self._config_dict[0] is not self.config:  # convert once per accepted config
            plain = config_to_dict(self.config) if self.config is not None else None
            self._config_dict = (self.config, redact_config(plain) if plain is not None else None)
        return self._config_dict[1]

    def _write_state(self) -> None:
        self.state_writer.write(self._state)
