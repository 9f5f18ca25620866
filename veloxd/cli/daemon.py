"""`veloxd run | status | reload | restart | logs`: argument handling only.

Nothing heavy at import time; the daemon never imports mlx (its workers do).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TextIO, cast

from veloxd import paths
from veloxd.cli import daemon_help
from veloxd.daemon import exitcodes
from veloxd.service.spec import DEFAULT_LABEL

STATUS_TIMEOUT_S = 5.0  # a daemon whose loop does not answer by then: its state file is shown instead


def state_dir_arg(p: argparse.ArgumentParser) -> None:
    """--state-dir, the same for every command that talks to (or reads) a running daemon."""
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help=f"the daemon's state directory (default: {paths.default_state_dir()})",
    )


def count(text: str) -> int:
    """argparse type of --lines: a count, so a negative one is a usage error, not a crash later."""
    value = int(text)  # argparse turns the ValueError into "invalid count value"
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    from veloxd.daemon.logs import LOG_FORMATS  # here: `plan` and `web` import this module for state_dir_arg only

    p = sub.add_parser(
        "run",
        help="run the daemon in the foreground: one supervised server per config entry",
        description="Supervise one `veloxd serve` worker per entry of the config, follow edits of the file "
        "(only changed entries restart), log JSON events. SIGHUP reloads; SIGTERM/SIGINT stop every "
        "server and exit 0. A missing or invalid config does not stop the daemon: it waits for a valid one.",
    )
    p.add_argument("--config", type=Path, help=f"config file (default: {paths.CONFIG_DEFAULT})")
    p.add_argument("--log-file", type=Path, help=f"JSON-lines log, size-rotated (default {paths.default_log_file()})")
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto",
        help="how events are printed on stdout: console (readable lines; colors on a terminal unless NO_COLOR "
        "is set), json (the log file's lines), auto (console on a terminal, nothing otherwise; default). "
        "The log file is always JSON",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning"),
        default="info",
        help="lowest level logged, to the file and stdout (default info; debug adds each worker's argv)",
    )
    state_dir_arg(p)
    p.add_argument(
        "--lifeline-fd",
        type=int,
        metavar="FD",
        help="stop every server and exit once this inherited descriptor (a pipe's read end) reaches EOF: "
        "for a wrapper that runs the daemon as its child, so the daemon does not outlive it (make run's "
        "demo passes one)",
    )
    p.add_argument(
        "--worker-command",
        metavar="CMD",
        help="command that replaces `python -m veloxd serve` for every worker (split like a shell; the "
        "entry's flags and --lifeline-fd N are appended), e.g. to wrap workers in a profiler",
    )
    p.set_defaults(func=run)

    p = sub.add_parser(
        "status",
        help="state of the daemon and of each server (and launchd's view)",
        description=exitcodes.help_text(),
    )
    p.add_argument("--json", action="store_true", help="print the state file as JSON")
    p.add_argument("--label", default=DEFAULT_LABEL, help=f"launchd label to report on (default {DEFAULT_LABEL})")
    state_dir_arg(p)
    p.set_defaults(func=status)

    p = sub.add_parser("reload", help="make the running daemon re-read its config now (as SIGHUP does)")
    p.description = daemon_help.description("reload")
    state_dir_arg(p)
    p.set_defaults(func=reload)

    p = sub.add_parser("restart", help="stop and start one server (also leaves FATAL)")
    p.description = daemon_help.description("restart")
    p.add_argument("name", help="server name (a key under `servers:`)")
    state_dir_arg(p)
    p.set_defaults(func=restart)

    p = sub.add_parser("logs", help="print the daemon's JSON log, optionally one server's lines")
    p.description = daemon_help.description("logs")
    p.add_argument("--server", metavar="NAME", help="only lines whose `server` is NAME")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    p.add_argument("--lines", "-n", type=count, metavar="N", help="only the last N matching lines")
    p.add_argument("--log-file", type=Path, help="log file (default: the running daemon's, else the default)")
    p.add_argument(
        "--pretty",
        action="store_true",
        help="render each event as `veloxd run` does on a terminal (colors unless NO_COLOR is set)",
    )
    state_dir_arg(p)
    p.set_defaults(func=logs)


def _state_dir(args: argparse.Namespace) -> Path:
    return (args.state_dir or paths.default_state_dir()).expanduser()


def run(args: argparse.Namespace) -> int:
    import logging

    from veloxd.daemon.daemon import Daemon, RunOptions
    from veloxd.daemon.logs import configure_logging
    from veloxd.daemon.process import default_worker_command
    from veloxd.daemon.statedir_guard import refuse_live_daemon
    from veloxd.daemon.statefile import AlreadyRunning, StartupError, acquire_lock, ensure_state_dir

    config = (args.config or paths.default_config_path()).expanduser().absolute()
    log_file = (args.log_file or paths.default_log_file()).expanduser().absolute()
    try:
        worker = shlex.split(args.worker_command) if args.worker_command else default_worker_command()
    except ValueError as err:  # shlex: "No closing quotation", "No escaped character"
        print(f"veloxd run: error: --worker-command {args.worker_command!r}: {err}", file=sys.stderr)
        return 2
    if not worker:
        print("veloxd run: error: --worker-command is empty", file=sys.stderr)
        return 2
    try:
        state_dir = ensure_state_dir(_state_dir(args).absolute())
        lock = acquire_lock(state_dir)
    except (AlreadyRunning, StartupError) as err:
        print(f"veloxd run: error: {err}", file=sys.stderr)
        return 1
    try:
        refuse_live_daemon(state_dir)  # the lock proves nothing once its file was removed
    except AlreadyRunning as err:
        print(f"veloxd run: error: {err}", file=sys.stderr)
        lock.close()
        return 1
    try:
        configure_logging(log_file, log_format=args.log_format, level=getattr(logging, args.log_level.upper()))
    except OSError as err:
        print(f"veloxd run: error: cannot open the log file {log_file}: {err.strerror or err}", file=sys.stderr)
        lock.close()
        return 1
    try:
        return Daemon(RunOptions(config, log_file, state_dir, worker, args.lifeline_fd, lock)).run()
    except StartupError as err:
        print(f"veloxd run: error: {err}", file=sys.stderr)
        return 1
    finally:
        lock.close()


def status(args: argparse.Namespace) -> int:
    from veloxd.daemon.statefile import read_state, state_path
    from veloxd.daemon.views import daemon_alive, render_status, status_code
    from veloxd.service.launchctl import format_status, launchd_status

    # launchd first: a daemon that crashes at start under launchd never writes a state file.
    launchd = launchd_status(args.label)  # None where there is no launchctl
    state = _live_state(_state_dir(args), read_state(_state_dir(args)))
    if args.json:
        alive = daemon_alive(state) if state is not None else False
        print(json.dumps({**(state or {}), "daemon_alive": alive, "launchd": launchd}, indent=2))
        return status_code(state)
    if launchd is not None:
        print(format_status(launchd))
    if state is None:
        path = state_path(_state_dir(args))
        why = (
            "cannot be read as the daemon's state (not a JSON object: cut short, or another file)"
            if path.is_file()
            else None
        )
        print(
            f"veloxd status: the state file {path} {why}"
            if why
            else f"veloxd status: no state file in {_state_dir(args)} (the daemon has not run)",
            file=sys.stderr,
        )
        return status_code(state)
    print(render_status(state))
    return status_code(state)


def _live_state(state_dir: Path, state: dict | None) -> dict | None:
    """The running daemon's own view, through its control socket: its state file may be stale or
    missing (a full disk or a read-only directory stops the writes, not the daemon; one started on a
    full disk never wrote it). The file when no daemon answers."""
    from veloxd.daemon.control import DaemonUnreachable, request, socket_path
    from veloxd.daemon.exitcodes import NOT_ANSWERING
    from veloxd.daemon.views import daemon_alive

    if state is None:
        path = socket_path(state_dir)
        if path is None or not path.exists():
            return None
    elif not daemon_alive(state):
        return state
    try:
        answer = request(state_dir, {"command": "status"}, timeout=STATUS_TIMEOUT_S)
    except (DaemonUnreachable, OSError, ValueError) as err:
        if state is None:
            return None
        print(f"veloxd status: the daemon did not answer ({err}); showing its state file", file=sys.stderr)
        return {**state, NOT_ANSWERING: str(err)}  # exit 3: a daemon that cannot act is not "up"
    live = answer.get("state") if answer.get("ok") else None
    return live if isinstance(live, dict) else state


def _ask(args: argparse.Namespace, payload: dict, command: str) -> dict | None:
    from veloxd.daemon.control import DaemonUnreachable, request

    try:
        return request(_state_dir(args), payload)
    except DaemonUnreachable as err:
        print(f"veloxd {command}: error: {err}", file=sys.stderr)
        return None


def reload(args: argparse.Namespace) -> int:
    answer = _ask(args, {"command": "reload"}, "reload")
    if answer is None:
        return 1
    if answer.get("errors"):
        for line in answer["errors"]:
            print(line, file=sys.stderr)
        if answer.get("kept_config_sha256"):
            print(
                "veloxd reload: the config is invalid; every server keeps running on the last good one", file=sys.stderr
            )
        else:
            print("veloxd reload: the config is invalid, and none was valid before: no server runs", file=sys.stderr)
        return 1
    if not answer.get("ok"):
        print(f"veloxd reload: error: {answer.get('error')}", file=sys.stderr)
        return 1
    if answer.get("unchanged"):
        print("config unchanged since the last reload: nothing to do")
        return 0
    plan = answer.get("plan") or {}
    parts = [f"{key} {', '.join(plan[key])}" for key in ("added", "removed", "changed", "updated") if plan.get(key)]
    print("reloaded: " + ("; ".join(parts) if parts else "no server affected"))
    return 0


def restart(args: argparse.Namespace) -> int:
    answer = _ask(args, {"command": "restart", "name": args.name}, "restart")
    if answer is None:
        return 1
    if not answer.get("ok"):
        print(f"veloxd restart: error: {answer.get('error')}", file=sys.stderr)
        return 1
    print(f"restarting {args.name}")
    return 0


def logs(args: argparse.Namespace) -> int:
    from collections import deque

    from veloxd.daemon.statefile import read_state
    from veloxd.daemon.views import follow, log_mismatch, read_lines

    state = read_state(_state_dir(args))
    if state is None:  # never written (a full disk, a read-only directory): the live daemon knows its log
        state = _live_state(_state_dir(args), None)
    recorded = ((state or {}).get("daemon") or {}).get("log_file")
    log_file = (args.log_file or (Path(recorded) if recorded else paths.default_log_file())).expanduser()
    if log_file.is_dir():
        print(f"veloxd logs: {log_file} is a directory, not a log file (pass --log-file FILE)", file=sys.stderr)
        return 2 if args.log_file else 1
    problem = log_mismatch(state, log_file)
    if problem is not None:
        print(f"veloxd logs: {problem}", file=sys.stderr)
        if not log_file.exists():
            return 1
    lines = read_lines(log_file, args.server)
    out = cast(TextIO, _PrettyOut(sys.stdout)) if args.pretty else sys.stdout
    printed = 0
    try:
        for line in deque(lines, maxlen=args.lines) if args.lines is not None else lines:
            out.write(line + "\n")
            printed += 1
        out.flush()
        if not printed and not args.follow:
            who = f" for server {args.server!r}" if args.server else ""
            print(f"veloxd logs: no lines{who} in {log_file}", file=sys.stderr)
        if args.follow:
            follow(log_file, args.server, out)
    except KeyboardInterrupt:
        return 0
    return 0


class _PrettyOut:
    """A text stream that renders each JSON log line it is given as a console line."""

    def __init__(self, stream: TextIO) -> None:
        from veloxd.daemon.console import ConsoleProcessor, use_colors

        self._stream = stream
        self._processor = ConsoleProcessor(use_colors(stream), with_date=True)

    def write(self, text: str) -> int:
        from veloxd.daemon.console import pretty_line

        for line in text.splitlines():
            self._stream.write(pretty_line(line, self._processor) + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
