"""End workers a previous daemon left behind, before this one binds their ports.

A worker counts as ours only if its pid is alive AND started at the recorded start time
(pids are reused; a bare pid could name somebody else's process), and only while the daemon that
recorded it is gone: a daemon still running (its lock file removed, so a second one got the lock)
keeps its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import psutil

from veloxd.daemon.process import is_same_process
from veloxd.daemon.statefile import live_daemon_pid

MAX_GRACE_S = 10.0
KILL_WAIT_S = 2.0  # after SIGKILL, until the process is gone and its port free


def leftover_workers(previous_state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Workers recorded in the previous state file that are still the same processes (none while the
    daemon that recorded them still runs: they are its workers, not orphans)."""
    if live_daemon_pid(previous_state) is not None:
        return []
    found = []
    records = dict((previous_state or {}).get("servers") or {})
    dashboard = (previous_state or {}).get("dashboard")
    if isinstance(dashboard, dict):  # the dashboard process (veloxd/daemon/sidecar.py) holds a port too
        records["@dashboard"] = dashboard
    for name, record in records.items():
        if not isinstance(record, dict):
            continue
        pid, start_time = record.get("pid"), record.get("start_time")
        if isinstance(pid, int) and pid > 1 and pid != os.getpid() and is_same_process(pid, start_time):
            found.append({**record, "server": name})
    return found


def end_orphans(previous_state: dict[str, Any] | None, log: Any) -> list[int]:
    """SIGTERM each leftover worker's group, SIGKILL whoever outlives its grace; return their pids."""
    owner = live_daemon_pid(previous_state)
    if owner is not None:
        log.error("orphans_spared", daemon_pid=owner, reason="recording_daemon_alive")
        return []
    orphans = leftover_workers(previous_state)
    for orphan in orphans:
        log.warning("orphan_found", server=orphan["server"], pid=orphan["pid"], port=orphan.get("port"))
        _signal(orphan, signal.SIGTERM)
    if not orphans:
        return []
    grace = min(max(float(o.get("stop_timeout_s") or 0) for o in orphans), MAX_GRACE_S)
    _, alive = psutil.wait_procs(_processes(orphans), timeout=grace)
    survivors = {process.pid for process in alive}
    for orphan in orphans:
        killed = orphan["pid"] in survivors
        if killed:
            _signal(orphan, signal.SIGKILL)
        log.warning("orphan_stopped", server=orphan["server"], pid=orphan["pid"], killed=killed)
    # A SIGKILLed process lingers for a moment; its port is only free once it is gone.
    psutil.wait_procs(_processes(orphans), timeout=KILL_WAIT_S)
    return [o["pid"] for o in orphans]


def _processes(orphans: list[dict[str, Any]]) -> list[psutil.Process]:
    """The orphans that are still the recorded processes (not yet gone, no reused pid)."""
    found = []
    for orphan in orphans:
        if is_same_process(orphan["pid"], orphan["start_time"]):
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(orphan["pid"]))
    return found


def _signal(orphan: dict[str, Any], signum: int) -> None:
    pgid = orphan.get("pgid") or orphan["pid"]
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(orphan["pid"], signum)
