"""One server entry's lifecycle: start, readiness, failure and backoff, stop.

`ServerProcess._become` is the only place a state changes; it checks the transition table
and logs the event named after the new state (`server_starting`, `server_ready`, ...).
Only the daemon's loop thread calls into this class; `now` is always monotonic and passed in.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from veloxd import protocol
from veloxd.config.world import Condition, entry_conditions
from veloxd.daemon import liveness
from veloxd.daemon.download import WAITS_ON, DownloadPhase, needs_download
from veloxd.daemon.exits import UNFIXABLE_EXIT, PortTaken, after_exit
from veloxd.daemon.models import model_prints
from veloxd.daemon.process import Child, describe_exit, error_line, worker_env
from veloxd.daemon.spawner import Spawner
from veloxd.daemon.state import (
    GiveUp,
    ServerState,
    after_failure,
    failures_in_window,
    recheck_delay,
    transition,
)
from veloxd.daemon.statefile import Changes
from veloxd.daemon.supervised import Supervised
from veloxd.distributed.command import group_status

S = ServerState
EVENT_FOR_STATE = {
    S.DOWNLOADING: "server_downloading",  # then more server_downloading events with the progress
    S.WAITING: "server_waiting",
    S.STARTING: "server_starting",
    S.READY: "server_ready",
    S.UNRESPONSIVE: "server_unresponsive",
    S.BACKOFF: "server_backoff",
    S.FATAL: "server_fatal",
    S.STOPPING: "server_stopping",
    S.STOPPED: "server_stopped",
}


CheckWorld = Callable[[Supervised], list[Condition]]


def wall_clock() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class ServerProcess:
    """The supervised process of one entry (the entry object may be replaced on live updates)."""

    def __init__(
        self,
        entry: Supervised,
        spawner: Spawner,
        log: Any,
        check_world: CheckWorld = entry_conditions,
        changes: Changes | None = None,
    ) -> None:
        self.changes = changes if changes is not None else Changes()  # what snapshot() shows moved
        self._entry = entry
        self.state = S.STOPPED
        self.since = wall_clock()
        self.child: Child | None = None
        self.spawn_id = 0
        self.starts = 0  # every worker spawned
        self.restarts = 0  # spawns after the first that no on-demand request asked for (crashes, reloads, restarts)
        self.on_demand_starts = 0  # spawns a request to a stopped on_demand server asked for
        self._fresh_start: str | None = "first"  # what the next spawn is when it is not a restart
        self.failures: list[float] = []
        self.last_exit: dict[str, Any] | None = None
        self.ready_payload: dict[str, Any] | None = None
        self.fatal_reason: str | None = None
        self.download: DownloadPhase | None = None  # while DOWNLOADING
        self.startup_s: float | None = None
        self.last_error: str | None = None  # what a person should read first after a failure
        self.last_error_at: str | None = None  # when (UTC): a server ready again still shows its last error
        self._refused: str | None = None  # why this worker's READY line was refused
        self.waiting_for: list[Condition] = []
        self.loaded: tuple[tuple[Any, ...], ...] = ()  # what its local model paths held at the last spawn
        self._check_world = check_world
        self._rechecks = 0
        self._recheck_at = 0.0
        self._spawner = spawner
        self._log = log.bind(server=entry.name)
        self._spawned_at = 0.0
        self._ready_deadline = 0.0
        self._retry_at = 0.0
        self._kill_at = 0.0
        self._killed = False
        self._timed_out = False
        self._awaiting_exit = False  # a worker was spawned and its exit not yet reported
        self._probe_cancel: threading.Event | None = None
        self.live: liveness.Liveness | None = None  # while READY, for an entry with a `health` section

    @property
    def entry(self) -> Supervised:
        return self._entry

    @entry.setter
    def entry(self, entry: Supervised) -> None:
        """A live update (or a restart with new settings): status shows its timeouts and start mode."""
        self._entry = entry
        self.changes.bump()

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None and self.child.returncode is None else None

    def _become(self, new: ServerState, **event: Any) -> None:
        """The one place state changes: check the edge, record the time, log the event."""
        old = self.state
        self.state = transition(old, new)
        self.since = wall_clock()
        self.changes.bump()
        level = "error" if new is S.FATAL else "warning" if new in (S.BACKOFF, S.WAITING, S.UNRESPONSIVE) else "info"
        pid = self.child.pid if self.child is not None else None  # the worker concerned, even if gone
        getattr(self._log, level)(EVENT_FOR_STATE[new], pid=pid, from_state=old.value, state=new.value, **event)

    # ---- commands from the supervisor -------------------------------------------------
    def start(self, now: float) -> None:
        """STOPPED/BACKOFF/WAITING -> DOWNLOADING if the model is not local yet, else on to STARTING."""
        self.child = None
        self.ready_payload = None
        self.live = None
        self._refused = None
        self._timed_out = self._killed = False
        if needs_download(self.entry.model, worker_env(self.entry.env)):
            self._start_download(now)
        else:
            self._start_worker(now)

    def _start_download(self, now: float) -> None:
        """-> DOWNLOADING: the download step runs; ready_timeout_s has not begun."""
        model = self.entry.model
        self.spawn_id += 1
        try:
            self.child = self._spawner.spawn_download(self.name, self.spawn_id, self.entry)
        except OSError as err:
            self._become(S.DOWNLOADING, model=model)
            self._give_up(f"cannot start the download of {model}: {err}", model=model)
            return
        self._awaiting_exit = True
        self.download = DownloadPhase(now)
        self._become(S.DOWNLOADING, model=model, argv=self.child.argv)
        self.child.release_output()  # its lines are logged after the event that names it

    def _start_worker(self, now: float) -> None:
        """-> STARTING: check the world, spawn the worker (or WAITING, or FATAL)."""
        entry = self.entry
        where = {"host": entry.host, "port": entry.port, "method": entry.method, "model": entry.model}
        conditions = self._check_world(entry)
        if conditions:
            self._wait(now, conditions, **where)
            return
        self.waiting_for, self._rechecks = [], 0
        self.spawn_id += 1
        self.starts += 1
        self.restarts += self._fresh_start is None
        self.on_demand_starts += self._fresh_start == "on_demand"
        self._fresh_start = None
        self.loaded = model_prints(entry)  # before the worker reads them: a change after counts
        try:
            self.child = self._spawner.spawn(self.name, self.spawn_id, entry)
        except OSError as err:
            self._become(S.STARTING, **where)
            self._give_up(f"cannot start the worker: {err}", **where)
            return
        self._awaiting_exit = True
        self._spawned_at = now
        self._ready_deadline = now + entry.ready_timeout_s
        self._become(S.STARTING, ready_timeout_s=entry.ready_timeout_s, **where)
        self._log.debug("server_command_built", pid=self.child.pid, argv=self.child.argv)  # once, for debugging
        self.child.release_output()  # its lines are logged after the event that names it

    def runs_current_model(self) -> bool:
        """Its worker (starting or ready) was spawned from what each of its local model paths holds
        now (a path that held nothing then does not count): a change of them seen since is one
        it has already started with (the recheck of a WAITING server that found the path)."""
        return self.state in (S.STARTING, S.READY) and all(self.loaded) and self.loaded == model_prints(self.entry)

    def recheck_soon(self, now: float) -> None:
        """A watch saw something that may clear this WAITING entry's condition: look at the next tick.
        (Also called after a live update: a READY server's next probe follows a shorter interval.)"""
        if self.state is S.WAITING:
            self._recheck_at = now
        policy = self.entry.health
        if self.state is S.READY and self.live is not None and policy is not None:
            self.live = liveness.rescheduled(self.live, now, policy)

    def _wait(self, now: float, conditions: list[Condition], **where: Any) -> None:
        """Into (or stay in) WAITING until the world changes; the event is logged when the reason changes."""
        self._rechecks += 1
        delay = recheck_delay(self._rechecks)
        self._recheck_at = now + delay
        reason = "; ".join(c.message for c in conditions)
        changed = [c.to_dict() for c in conditions] != [c.to_dict() for c in self.waiting_for]
        self.waiting_for = conditions
        if changed:
            self.changes.bump()  # waiting_reason
        details = {"reason": reason, "conditions": [c.to_dict() for c in conditions], "recheck_s": delay}
        if self.state is not S.WAITING:
            self._become(S.WAITING, **details, **where)
        elif changed:
            self._log.warning("server_waiting", pid=None, from_state="waiting", state="waiting", **details)

    def stop(self, now: float) -> None:
        """Any state -> STOPPING: SIGTERM to the worker's group; STOPPED at once without one."""
        if self.state in (S.STOPPING, S.STOPPED):
            return
        self._cancel_probe()
        hung = self.state is S.UNRESPONSIVE  # already sent SIGTERM; its SIGKILL deadline stands
        self._become(S.STOPPING, stop_timeout_s=self.entry.stop_timeout_s)
        if self.child is not None and self._awaiting_exit:
            if not hung:
                self.child.signal_group(signal.SIGTERM)  # STOPPED when the exit is reported
                self._kill_at = now + self.entry.stop_timeout_s
            return
        self._become(S.STOPPED, exit=self.last_exit)

    def start_on_demand(self) -> None:
        """The next spawn is asked by a request (the gateway's admission): a start, not a restart."""
        self._fresh_start = "on_demand"

    def kill_now(self) -> None:
        """Second shutdown signal: SIGKILL without waiting for the grace period."""
        if self.state is S.STOPPING and self.child is not None and self.child.signal_group(signal.SIGKILL):
            self._killed = True

    def clear_failures(self) -> None:
        self.failures.clear()
        self.fatal_reason = None
        self.changes.bump()  # failures, fatal_reason

    # ---- reports from the worker (via the loop) ---------------------------------------
    def on_ready_line(self, spawn_id: int, payload: dict[str, Any], problem: str | None = None) -> None:
        if spawn_id != self.spawn_id or self.state is not S.STARTING:
            return
        kv = self.entry.kv  # None: the gateway's and the dashboard's READY lines carry no KV settings
        if problem is None and kv is not None:
            problem = protocol.config_mismatch(kv.applied(), payload.get("config"))
        if problem is not None and self.child is not None:
            # A worker running other settings than asked (or speaking another protocol) is not
            # this entry's server: stop it; its exit becomes a FATAL failure naming the problem.
            self._refused = problem
            self._log.error("server_refused", pid=self.child.pid, reason=problem)
            self.child.signal_group(signal.SIGKILL)
            return
        self.ready_payload = payload
        self.changes.bump()  # status shows the READY line while /health is awaited
        entry = self.entry
        self._probe_cancel = self._spawner.probe_health(
            self.name, spawn_id, entry.host, entry.port, self._ready_deadline
        )

    def on_download_line(self, spawn_id: int, payload: dict[str, Any], now: float) -> None:
        if spawn_id != self.spawn_id or self.state is not S.DOWNLOADING or self.download is None:
            return
        progress = self.download.on_line(payload, now)
        self.changes.bump()  # the step reports about once a second: status follows it
        if progress is not None:
            self._log.info("server_downloading", pid=self.pid, model=self.entry.model, **progress)

    def on_healthy(self, spawn_id: int, now: float) -> None:
        if spawn_id != self.spawn_id or self.state is not S.STARTING:
            return
        self._probe_cancel = None
        self.startup_s = round(now - self._spawned_at, 3)
        policy = self.entry.health  # model servers have one; the gateway and dashboard not
        self.live = liveness.on_ready(now, policy) if policy is not None else None
        self._become(S.READY, startup_s=self.startup_s, ready=self.ready_payload)

    def on_health_probed(self, spawn_id: int, sequence: int, error: str | None, now: float) -> None:
        """A liveness probe's outcome; `health.failures` failures in a row: UNRESPONSIVE, SIGTERM."""
        policy = self.entry.health
        if spawn_id != self.spawn_id or self.state is not S.READY or self.live is None or policy is None:
            return
        before = self.live
        self.live = liveness.probe_finished(before, sequence, error, now, policy)
        if self.live is before:
            return
        if self.live.failures != before.failures:
            self.changes.bump()  # health.failures
        pid = self.pid
        if error is None:
            if before.failures:
                self._log.info("server_health_recovered", pid=pid, failures=before.failures)
            return
        self._log.warning(
            "server_health_failed", pid=pid, failures=self.live.failures, limit=policy.failures, error=error
        )
        if not liveness.hung(self.live, policy):
            return
        self._note_error(f"unresponsive: {self.live.failures} health probes failed in a row (last: {error})")
        self._become(
            S.UNRESPONSIVE,
            failures=self.live.failures,
            interval_s=policy.interval_s,
            timeout_s=policy.timeout_s,
            error=error,
            stop_timeout_s=self.entry.stop_timeout_s,
        )
        if self.child is not None:
            self.child.signal_group(signal.SIGTERM)  # a hung worker may ignore it: SIGKILL at _kill_at
        self._kill_at, self._killed = now + self.entry.stop_timeout_s, False

    def on_exit(self, spawn_id: int, returncode: int, now: float) -> None:
        if spawn_id != self.spawn_id or self.child is None or not self._awaiting_exit:
            return
        self._awaiting_exit = False
        self.changes.bump()  # pid, last_exit
        if self.state is S.DOWNLOADING:
            self._download_exited(returncode, now)
            return
        self._cancel_probe()
        tail = self.child.last_lines()
        self.last_exit = {
            **describe_exit(returncode),
            "at": wall_clock(),
            "pid": self.child.pid,
            "error": error_line(tail),
        }
        expected = self.state is S.STOPPING
        level = "info" if expected else "warning"
        getattr(self._log, level)(
            "server_exited", pid=self.child.pid, expected=expected, **describe_exit(returncode), last_lines=tail
        )
        if expected:
            self._become(S.STOPPED, exit=self.last_exit, killed=self._killed)
            return
        if self.state not in (S.STARTING, S.READY, S.UNRESPONSIVE):
            return
        entry = self.entry
        verdict = after_exit(
            self.state,
            returncode,
            tail,
            self.last_exit["error"],
            timed_out=self._timed_out,
            refused=self._refused,
            host=entry.host,
            port=entry.port,
        )
        if isinstance(verdict, PortTaken):
            where = {"host": entry.host, "port": entry.port, "method": entry.method, "model": entry.model}
            self._wait(now, [verdict.condition], **where)
            return
        if verdict.last_error is not None:
            self._note_error(verdict.last_error)
        self._fail(now, verdict.reason, verdict.unfixable, last_lines=tail)

    def _download_exited(self, returncode: int, now: float) -> None:
        """The download step ended: load the model (STARTING), or fail as its verdict says."""
        assert self.child is not None and self.download is not None
        phase, pid, model = self.download, self.child.pid, self.entry.model
        self.download = None
        if returncode == 0:
            self._log.info("server_downloaded", pid=pid, model=model, **phase.finished(now))
            self._start_worker(now)
            return
        reason, message = phase.failure_reason(describe_exit(returncode))
        self._note_error(message)
        self.last_exit = {**describe_exit(returncode), "at": wall_clock(), "pid": pid}
        self._log.warning(
            "server_download_failed",
            pid=pid,
            model=model,
            reason=reason,
            message=message,
            **describe_exit(returncode),
            last_lines=self.child.last_lines(),
        )
        if reason in WAITS_ON:  # the hub unreachable, the disk full: wait for the world, count nothing
            self._wait(now, [Condition("download", ("model",), message)], model=model)
            return
        unfixable = message if returncode == UNFIXABLE_EXIT else None
        self._fail(now, "download_failed", unfixable, detail=message, download_reason=reason)

    # ---- timers -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.state is S.STARTING and self.child is not None and not self._timed_out and now >= self._ready_deadline:
            self._timed_out = True  # the exit that follows becomes the failure
            self._cancel_probe()
            self._log.warning("server_ready_timed_out", pid=self.child.pid, ready_timeout_s=self.entry.ready_timeout_s)
            self.child.signal_group(signal.SIGKILL)
        elif (self.state is S.BACKOFF and now >= self._retry_at) or (
            self.state is S.WAITING and now >= self._recheck_at
        ):
            self.start(now)  # retry after backoff, or look at the world again
        elif self.state is S.READY and self.live is not None and liveness.probe_due(self.live, now):
            self._probe(now)
        elif self.state in (S.STOPPING, S.UNRESPONSIVE) and not self._killed and now >= self._kill_at:
            self._killed = True
            if self.child is not None and self.child.signal_group(signal.SIGKILL):
                self._log.warning("server_killed", pid=self.child.pid, stop_timeout_s=self.entry.stop_timeout_s)

    def next_deadline(self) -> float | None:
        if self.state is S.STARTING and self.child is not None and not self._timed_out:
            return self._ready_deadline
        if self.state is S.BACKOFF:
            return self._retry_at
        if self.state is S.WAITING:
            return self._recheck_at
        if self.state in (S.STOPPING, S.UNRESPONSIVE) and not self._killed:
            return self._kill_at
        if self.state is S.READY and self.live is not None:
            return liveness.next_deadline(self.live)
        return None

    def _probe(self, now: float) -> None:
        """Start one liveness probe; its report (HealthProbed) arrives through the loop."""
        entry = self.entry
        assert self.live is not None and entry.health is not None  # live is set only under a health policy
        self.live = liveness.probe_started(self.live)
        self.changes.bump()  # health.probes
        timeout = entry.health.timeout_s
        self._spawner.check_health(self.name, self.spawn_id, self.live.sequence, entry.host, entry.port, timeout)

    # ---- helpers ----------------------------------------------------------------------
    def _fail(self, now: float, reason: str, unfixable: str | None, detail: str | None = None, **event: Any) -> None:
        policy = self.entry.restart
        decision = after_failure(self.failures, now, policy, unfixable)
        # Those the window still counts: bounded by max_failures, as FATAL follows at that count.
        self.failures = [*failures_in_window(self.failures, now, policy.window_s), now]
        if isinstance(decision, GiveUp):
            why = decision.reason if unfixable is not None or detail is None else f"{decision.reason}; last: {detail}"
            self._give_up(why, failures=decision.failures, failure=reason, **event)
            return
        self._retry_at = now + decision.delay_s
        self._become(S.BACKOFF, reason=reason, delay_s=decision.delay_s, failures=decision.failures, **event)

    def _give_up(self, reason: str, **event: Any) -> None:
        self.fatal_reason = reason
        if "last_lines" not in event:  # else the worker's own last stderr line says more
            self._note_error(reason)
        self._become(S.FATAL, reason=reason, **event)

    def _note_error(self, text: str) -> None:
        self.last_error, self.last_error_at = text, wall_clock()

    def _cancel_probe(self) -> None:
        if self._probe_cancel is not None:
            self._probe_cancel.set()
            self._probe_cancel = None

    def waiting_reason(self) -> str | None:
        """What the world lacks for this server to start (its waiting conditions), while it waits."""
        return "; ".join(c.message for c in self.waiting_for) if self.state is S.WAITING else None

    def snapshot(self) -> dict[str, Any]:
        """This server's facts for the state file."""
        entry = self.entry
        child = self.child if self.child is not None and self.child.returncode is None else None  # alive
        return {
            "state": self.state.value,
            "pid": child.pid if child is not None else None,
            "pgid": child.pgid if child is not None else None,
            "start_time": child.start_time if child is not None else None,
            "host": entry.host,
            "port": entry.port,
            "method": entry.method,
            "model": entry.model,
            "since": self.since,
            "restarts": self.restarts,
            "starts": self.starts,
            "on_demand_starts": self.on_demand_starts,
            "failures": len(self.failures),
            "last_exit": self.last_exit,
            "fatal_reason": self.fatal_reason,
            "download": self.download.progress() if self.download is not None else None,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "startup_s": self.startup_s,
            # while READY: liveness probes started since, and how many of the last ones failed in a row
            "health": {"probes": self.live.sequence, "failures": self.live.failures} if self.live is not None else None,
            "ready": self.ready_payload,  # the worker's READY line: bits, measured KV bytes per token, endpoints
            "waiting_reason": self.waiting_reason(),
            "stop_timeout_s": entry.stop_timeout_s,
            "start": entry.start,
            # a distributed entry: the group's state and each rank's pid and host (READY's ranks)
            "distributed": group_status(entry.distributed, self.state.value, self.ready_payload),
        }
