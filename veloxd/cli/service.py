"""`veloxd install` and `veloxd uninstall`: argument handling and the one-line reports (logic lives in
agent.py for launchd and systemd.py for systemd)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veloxd.paths import CONFIG_DEFAULT
from veloxd.service import agent, launchctl, systemd
from veloxd.service.gather import InstallError, absolute, gather
from veloxd.service.plist import plist_bytes
from veloxd.service.runner import InstallFailed
from veloxd.service.spec import DEFAULT_LABEL, DEFAULT_UNIT, AgentSpec, check_label
from veloxd.service.unit import render_unit


def register(sub: argparse._SubParsersAction) -> None:
    install = sub.add_parser(
        "install",
        help="run the daemon at login: a LaunchAgent (macOS) or, with --systemd, a systemd user unit",
        description=(
            "Write ~/Library/LaunchAgents/LABEL.plist and bootstrap it into gui/$UID (or, with --systemd, "
            "~/.config/systemd/user/veloxd.service and `systemctl --user enable --now`). Safe to re-run: "
            "an unchanged agent is restarted, a changed one is replaced."
        ),
    )
    install.add_argument(
        "--config",
        metavar="FILE",
        help=f"the veloxd.yaml to serve (default: {CONFIG_DEFAULT})",
    )
    _add_common(install)
    install.add_argument(
        "--log-file", metavar="FILE", help="the daemon's JSON log (default: the platform's log location)"
    )
    install.add_argument(
        "--state-dir", metavar="DIR", help="the daemon's state directory (default: the platform's one)"
    )
    install.add_argument("--print", action="store_true", help="print the plist (or unit) and change nothing")
    install.set_defaults(func=run_install)

    uninstall = sub.add_parser(
        "uninstall",
        help="stop the daemon and remove the LaunchAgent (or systemd unit)",
        description=(
            "Boot the job out of gui/$UID, waiting for the daemon's clean stop, and remove "
            "~/Library/LaunchAgents/LABEL.plist (or, with --systemd, `systemctl --user disable --now` and "
            "remove the unit). Safe to re-run: what is already gone is skipped. A `launchctl disable` is kept."
        ),
    )
    _add_common(uninstall)
    uninstall.set_defaults(func=run_uninstall)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--label",
        help=f"launchd label (default {DEFAULT_LABEL}) or, with --systemd, unit name (default {DEFAULT_UNIT})",
    )
    parser.add_argument("--systemd", action="store_true", help="use a systemd user unit instead of launchd (Linux)")


def _label(args: argparse.Namespace) -> str:
    return check_label(args.label or (DEFAULT_UNIT if args.systemd else DEFAULT_LABEL))


def _missing_tool(args: argparse.Namespace, command: str) -> str | None:
    """Why `veloxd COMMAND` cannot run here; the hint names COMMAND, so it can be pasted as is."""
    if args.systemd:
        return None if systemd.available() else "systemctl not found on PATH: --systemd needs a systemd user session"
    if launchctl.available():
        return None
    return f"launchctl not found on PATH: this is not macOS (on Linux, use `veloxd {command} --systemd`)"


def run_install(args: argparse.Namespace) -> int:
    try:
        label = _label(args)
        missing = None if args.print else _missing_tool(args, "install")
        if missing:
            raise InstallError(missing)
        gathered = gather(label, args.config, args.log_file, args.state_dir)
    except (InstallError, ValueError) as err:
        print(f"veloxd install: {err}", file=sys.stderr)
        return 2
    for note in gathered.notes:
        print(note, file=sys.stderr)
    spec = gathered.spec
    if args.print:
        sys.stdout.write(render_unit(spec) if args.systemd else plist_bytes(spec).decode())
        return 0
    try:
        _make_dirs(spec)
        line = systemd.install(spec, label) if args.systemd else agent.install(spec)
    except InstallFailed as err:
        print(f"veloxd install: {err}", file=sys.stderr)
        print(
            "veloxd install: fix the cause above and run `veloxd install` again (re-running is safe)", file=sys.stderr
        )
        return 1
    print(line)
    return 0


def _make_dirs(spec: AgentSpec) -> None:
    """gather() refused the paths that cannot be directories; what is left to fail here is permission."""
    for directory, mode in ((spec.paths["log_dir"], 0o777), (spec.state_dir, 0o700)):  # 0o700: the control socket
        try:
            Path(directory).mkdir(parents=True, exist_ok=True, mode=mode)  # launchd will not create either
        except OSError as err:
            raise InstallFailed(f"cannot create {directory}: {err.strerror or err}") from None


def run_uninstall(args: argparse.Namespace) -> int:
    try:
        label = _label(args)
        missing = _missing_tool(args, "uninstall")
        if missing:
            raise InstallError(missing)
    except (InstallError, ValueError) as err:
        print(f"veloxd uninstall: {err}", file=sys.stderr)
        return 2
    try:
        line = systemd.uninstall(label) if args.systemd else agent.uninstall(label, absolute(Path.home()))
    except InstallFailed as err:
        print(f"veloxd uninstall: {err}", file=sys.stderr)
        return 1
    print(line)
    return 0
