"""What `veloxd status` and `veloxd logs` show: the state file as a table, the JSON log filtered.

Read-only: these run in the CLI process, never in the daemon.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from veloxd.daemon.exitcodes import NOT_ANSWERING, exit_code
from veloxd.daemon.process import is_same_process
from veloxd.download.progress import summary

COLUMNS = ("NAME", "STATE", "PID", "PORT", "METHOD", "SINCE", "RESTARTS", "LAST EXIT")


def daemon_alive(state: dict[str, Any]) -> bool:
    daemon = state.get("daemon") or {}
    pid = daemon.get("pid")
    return bool(daemon.get("running")) and isinstance(pid, int) and is_same_process(pid, daemon.get("start_time"))


def _exit_text(last_exit: dict[str, Any] | None) -> str:
    if not last_exit:
        return "-"
    if last_exit.get("signal"):
        return str(last_exit["signal"])
    return f"code {last_exit.get('code')}"


def _state_text(server: dict[str, Any]) -> str:
    download = server.get("download")
    if server.get("state") == "downloading" and download:
        return f"downloading {download.get('percent', 0):.0f}%"
    state = str(server.get("state", "?"))
    if server.get("held_reason"):
        return f"{state}, restart held: {server['held_reason']}"
    return f"{state}, {server['pending']} queued" if server.get("pending") else state


def status_rows(state: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, server in (state.get("servers") or {}).items():
        rows.append(
            (
                name,
                _state_text(server) + (" (daemon down)" if not daemon_alive(state) and server.get("pid") else ""),
                str(server.get("pid") or "-"),
                str(server.get("port", "-")),
                str(server.get("method", "-")),
                str(server.get("since", "-")),
                str(server.get("restarts", 0)),
                _exit_text(server.get("last_exit")),
            )
        )
    return rows


def group_text(group: dict[str, Any]) -> str:
    """A distributed entry's line: the group's state, then each rank's pid and host once reported."""
    head = f"group of {group.get('world_size')} ranks ({group.get('backend')}, {group.get('parallelism')}), {group.get('state')}"
    ranks = group.get("ranks")
    if not ranks:
        hosts = ", ".join(group.get("hosts") or []) or "?"
        return f"{head}; ranks not reported yet (hosts {hosts})"
    return head + ": " + ", ".join(f"rank {r.get('rank')} pid {r.get('pid')} on {r.get('host') or '?'}" for r in ranks)


def log_write_lines(log_write: dict[str, Any] | None) -> list[str]:
    """The log file's health: records being lost now, or lost earlier (see log_write_recovered)."""
    if not log_write or not log_write.get("lost_records_total"):
        return []
    total = log_write["lost_records_total"]
    if log_write.get("failing"):
        return [
            f"log: cannot write {log_write.get('log_file')} since {log_write.get('failed_since')} "
            f"({log_write.get('error')}); {log_write.get('lost_records')} records lost so far (servers unaffected)"
        ]
    return [f"log: {total} records could not be written earlier (log_write_recovered in the log says when)"]


def fatal_text(server: dict[str, Any]) -> str:
    """Why a server is FATAL, with the worker's last error line when the reason does not already say it."""
    reason = str(server["fatal_reason"])
    last = (server.get("last_exit") or {}).get("error") or server.get("last_error")
    return f"{reason}; last error: {last}" if last and str(last) not in reason else reason


def render_status(state: dict[str, Any]) -> str:
    """The human view: daemon line, config and last reload, then one row per server."""
    daemon = state.get("daemon") or {}
    alive = daemon_alive(state)
    lines = [f"daemon: {'running, pid ' + str(daemon.get('pid')) if alive else 'not running'}"]
    if alive and state.get(NOT_ANSWERING):
        lines[0] += (
            f", NOT ANSWERING on its control socket ({state[NOT_ANSWERING]}): stopped or hung?"
            " below is its last state file, which may be stale"
        )
    sha = state.get("config_sha256")
    config = state.get("config_path", "?")
    lines.append(f"config: {config}" + (f" (sha256 {sha[:12]})" if sha else " (no valid config: degraded)"))
    reload = state.get("last_reload")
    if reload:
        verdict = (
            "ok"
            if reload.get("ok")
            else (
                "FAILED, kept the last good config"
                if reload.get("kept_config_sha256")
                else "FAILED, and no config was valid before: no server runs"
            )
        )
        changes = reload.get("file_changes") or 0
        burst = f", {changes} changes of the file merged: only its content now counts" if changes > 1 else ""
        lines.append(f"last reload: {verdict} at {reload.get('at')} ({reload.get('source')}{burst})")
        lines += [f"  {error}" for error in reload.get("errors") or []]
    lines += log_write_lines(daemon.get("log_write"))
    if daemon.get("state_write_error"):
        lines.append(f"state file: cannot be written ({daemon['state_write_error']}); shown as the daemon answered")
    if daemon.get("step_failures"):
        lines.append(
            f"daemon: {daemon['step_failures']} internal error(s) caught, servers kept "
            "(daemon_step_failed in its log, with the traceback: please report it)"
        )
    dashboard = state.get("dashboard")
    gateway = (state.get("servers") or {}).get("@gateway")  # serves the dashboard when there is one
    if dashboard:
        lines.append(
            f"dashboard: {dashboard.get('state')} at http://{dashboard.get('host')}:{dashboard.get('port')}/"
            + (f" (pid {dashboard['pid']})" if dashboard.get("pid") else "")
        )
    elif gateway and gateway.get("port"):
        lines.append(f"dashboard: http://127.0.0.1:{gateway['port']}/ and /metrics (served by @gateway)")
    rows = status_rows(state)
    if not rows:
        lines.append("no servers")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines.append("")
    for row in [COLUMNS, *rows]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip())
    for name, server in (state.get("servers") or {}).items():
        if server.get("fatal_reason") and server.get("state") == "fatal":
            lines.append(f"{name}: {fatal_text(server)}")
        download = server.get("download")
        if server.get("state") == "downloading":
            progress = (
                summary(download["done_bytes"], download["total_bytes"], download["rate_bps"], download["eta_s"])
                if download and download.get("total_bytes")
                else "listing files"
            )
            lines.append(f"{name}: downloading {server.get('model')}: {progress}")
        group = server.get("distributed")
        if group:
            lines.append(f"{name}: {group_text(group)}")
        if server.get("waiting_reason") and server.get("state") == "waiting":
            lines.append(f"{name}: waiting: {server['waiting_reason']}")
        elif server.get("state") in ("starting", "backoff") and (server.get("last_exit") or {}).get("error"):
            lines.append(f"{name}: last exit: {server['last_exit']['error']}")
    if state.get("memory"):
        from veloxd.daemon.memory import render_table

        lines += ["", *render_table(state["memory"])]
    return "\n".join(lines)


def status_code(state: dict[str, Any] | None) -> int:
    """`veloxd status`'s exit code (the table in veloxd/daemon/exitcodes.py)."""
    return exit_code(state, state is not None and daemon_alive(state))


# ---- logs ------------------------------------------------------------------------------
def log_files(log_file: Path) -> list[Path]:
    """The rotated backups, oldest first, then the live file."""
    backups = sorted(
        (p for p in log_file.parent.glob(log_file.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*backups, log_file]


def matches(line: str, server: str | None) -> bool:
    if server is None:
        return True
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and record.get("server") == server


def log_mismatch(state: dict[str, Any] | None, log_file: Path) -> str | None:
    """Why `log_file` is not what the running daemon writes, or None when it is (or no daemon runs)."""
    alive = state is not None and daemon_alive(state)
    if not log_file.exists():
        if not alive:
            return f"{log_file} does not exist, and no daemon is running with this state directory"
        return (
            f"{log_file} does not exist (moved or deleted?); the daemon recreates it with its next "
            "event, or at once on SIGHUP"
        )
    if state is None or not alive:
        return None
    daemon = state.get("daemon") or {}
    recorded, ident = daemon.get("log_file"), daemon.get("log_file_id")
    if recorded and Path(recorded).expanduser() != log_file:
        return f"reading {log_file}, but the running daemon writes {recorded}"
    try:
        info = os.stat(log_file)
    except OSError:
        return None
    if ident and [info.st_dev, info.st_ino] != list(ident):
        return (
            f"{log_file} is not the file the running daemon writes (it was moved or replaced); the daemon "
            "reopens the path with its next event, or at once on SIGHUP"
        )
    return None


def read_lines(log_file: Path, server: str | None) -> Iterator[str]:
    for path in log_files(log_file):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if not line.endswith("\n"):
                        break  # the record being written now: printed complete by the next read
                    if matches(line, server):
                        yield line.rstrip("\n")
        except FileNotFoundError:
            continue


def follow(log_file: Path, server: str | None, out: TextIO, interval: float = 0.2) -> None:
    """Print matching lines appended from now on; reopen the file when it is rotated."""
    handle = None
    inode = None
    at_end = True  # the first file is followed from its end (earlier lines were printed already)
    partial = b""
    while True:
        if handle is None:
            try:
                handle = open(log_file, "rb")  # noqa: SIM115 - kept open across iterations
            except FileNotFoundError:
                time.sleep(interval)
                continue
            inode = os.fstat(handle.fileno()).st_ino
            if at_end:
                handle.seek(0, os.SEEK_END)
            at_end = False  # a rotated-in file is read from its start
        chunk = handle.readline()
        if chunk:
            partial += chunk
            if partial.endswith(b"\n"):
                line = partial.decode("utf-8", "replace")
                partial = b""
                if matches(line, server):
                    out.write(line)
                    out.flush()
            continue
        try:
            rotated = os.stat(log_file).st_ino != inode
        except FileNotFoundError:
            rotated = True
        if rotated:
            for line in (partial + handle.read()).decode("utf-8", "replace").splitlines(keepends=True):
                if matches(line, server):  # lines written just before the rename
                    out.write(line)
            out.flush()
            partial = b""
            handle.close()
            handle = None
            continue
        time.sleep(interval)
