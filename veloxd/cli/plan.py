"""`veloxd plan`: argument handling and output only (the diff is veloxd.config.plan's)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from veloxd.cli.config import EXIT_INVALID, EXIT_UNREADABLE, EXIT_VALID, method_text
from veloxd.cli.daemon import state_dir_arg
from veloxd.paths import CONFIG_DEFAULT, default_config_path, default_state_dir


def register(sub: Any) -> None:
    plan = sub.add_parser(
        "plan",
        help="show what applying a config would change in the running daemon",
        description="Compare FILE with the config the running daemon applied (from its "
        "state file; without a running daemon, with an empty state) and list the servers to "
        "start, restart, update in place, stop or keep, and what will make a server wait "
        "(or a ready server keep its settings, restart held) once applied: a port another "
        "process holds, a model path not there yet. A server whose restart is held is compared with "
        "the settings it runs: back to them, it is left alone. Changes nothing.",
    )
    plan.add_argument("file", nargs="?", metavar="FILE", help=f"config file (default: {CONFIG_DEFAULT})")
    state_dir_arg(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from veloxd.config.loader import inspect_config
    from veloxd.config.plan import diff
    from veloxd.daemon.held import foreseen

    path = args.file or str(default_config_path())
    result = inspect_config(path)
    if result.config is None:
        for issue in result.issues:
            print(issue, file=sys.stderr)
        return EXIT_UNREADABLE if result.unreadable else EXIT_INVALID
    state_dir = args.state_dir or default_state_dir()
    try:
        current, states, against = _applied(state_dir)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"veloxd plan: cannot read the daemon state in {state_dir}: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    plan = diff(current, _redacted(result.config) if current is not None else result.config)
    entries = result.config.supervised()
    serving = {name for name, state in states.items() if state == "ready"}
    blocked = foreseen(plan, current.supervised() if current is not None else {}, entries, serving)
    outcome = {name: "held" if name in serving and name in plan.changed else "waits" for name in blocked}
    dashboard = _dashboard_change(current.dashboard if current is not None else None, result.config.dashboard)
    if args.json:
        conditions = {
            name: {"outcome": outcome[name], "conditions": [c.to_dict() for c in found]}
            for name, found in blocked.items()
        }
        report = {"file": path, "against": against, **plan.to_dict(), "conditions": conditions, "dashboard": dashboard}
        print(json.dumps(report, indent=2))
        return EXIT_VALID
    print(f"plan for {path}: {against}")
    lines: list[tuple[str, str]] = []
    for name in plan.added:
        e = entries[name]
        when = "known    (start: on_demand, on its first request)" if e.start == "on_demand" else "start   "
        lines.append((name, f"  + {name:<20} {when} ({method_text(e)} on {e.host}:{e.port})"))
    lines += [(name, f"  ~ {name:<20} restart  ({', '.join(keys)})") for name, keys in plan.changed.items()]
    lines += [(name, f"  ~ {name:<20} update   ({', '.join(keys)})") for name, keys in plan.updated.items()]
    lines += [(name, f"  - {name:<20} stop") for name in plan.removed]
    lines += [(name, f"  = {name:<20} unchanged") for name in plan.unchanged]
    for name, line in lines:
        print(line)
        for condition in blocked.get(name, []):
            verb = "restart held (it keeps serving as it runs) while" if outcome[name] == "held" else "waits while"
            print(f"      {verb}: {condition.message}")
    if dashboard is not None:
        block = result.config.dashboard
        where = f"({block.host}:{block.port})" if block is not None else ""
        sign = {"start": "+", "restart": "~", "stop": "-", "unchanged": "="}[dashboard]
        print(f"  {sign} {'(dashboard)':<20} {dashboard:<8} {where}".rstrip())
    acted = dashboard if dashboard in ("start", "restart", "stop") else None
    waiting = f"; {len(blocked)} will wait" if blocked else ""
    print(plan.summary() + (f"; the dashboard to {acted}" if acted else "") + waiting)
    if result.config.gateway is not None:  # the memory budget is the gateway's
        from veloxd.daemon.memory import offline_table, render_table

        print()
        print("\n".join(render_table(offline_table(result.config, state_dir))))
    return EXIT_VALID


def _dashboard_change(old: Any, new: Any) -> str | None:
    """What a reload does to the dashboard process: start, restart, stop, unchanged (None: there is none)."""
    if old is None and new is None:
        return None
    if old is None:
        return "start"
    if new is None:
        return "stop"
    return "unchanged" if old == new else "restart"


def _redacted(config: Any) -> Any:
    """The file's config with secrets redacted as the state file has them, so they compare equal."""
    from veloxd.config.roundtrip import config_from_dict, config_to_dict
    from veloxd.config.secrets import redact_config

    return config_from_dict(redact_config(config_to_dict(config)))


def _applied(state_dir: Path) -> tuple[Any, dict[str, str], str]:
    """The config the running daemon applied (from its state file), each server's state in it,
    and a note saying what was compared."""
    from veloxd.config.roundtrip import config_from_dict
    from veloxd.daemon.held import with_running
    from veloxd.daemon.statefile import read_state
    from veloxd.daemon.views import daemon_alive

    state = read_state(state_dir)
    if not state or not state.get("config") or not daemon_alive(state):
        return None, {}, "no running daemon found; planning against an empty state"
    servers = state.get("servers") or {}
    # a server whose restart is held runs other settings than the config asks: compared with those
    current = config_from_dict(with_running(state["config"], servers))
    states = {name: server.get("state") for name, server in servers.items()}
    held = sorted(name for name, server in servers.items() if server.get("held_runs"))
    note = f"; a held restart ({', '.join(held)}) against the settings its server runs" if held else ""
    return (
        current,
        states,
        f"against the config the running daemon applied ({state.get('config_path') or current.source}){note}",
    )
