"""`veloxd check`, `veloxd schema` and `veloxd plan`: argument handling and output only."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from veloxd.cli.daemon import state_dir_arg
from veloxd.paths import CONFIG_DEFAULT, default_config_path, default_state_dir

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


def register(sub: Any) -> None:
    check = sub.add_parser(
        "check",
        help="validate a config file (exit 0 valid, 1 invalid, 2 unreadable)",
        description="Validate a veloxd.yaml. Errors go to stderr, one per line, as "
        "FILE:LINE:COL: message (at $.json.path). Conditions of the world that make an entry "
        "wait in the daemon (a model path that does not exist yet, an unset api_key_env "
        "variable) and keys that do nothing where they are written are warnings, in the same "
        "form. Exit 0 valid (warnings or not; 1 with "
        "--strict when there are warnings), 1 invalid, 2 unreadable.",
    )
    check.add_argument("file", nargs="?", metavar="FILE", help=f"config file (default: {CONFIG_DEFAULT})")
    check.add_argument("--json", action="store_true", help="print {valid, errors: [...], warnings: [...]} on stdout")
    check.add_argument("--strict", action="store_true", help="exit 1 when there are warnings too")
    check.add_argument(
        "--effective",
        action="store_true",
        help="when valid, print the config as the daemon sees it: defaults filled in, paths resolved",
    )
    check.set_defaults(func=run_check)

    schema = sub.add_parser(
        "schema",
        help="print the JSON Schema of veloxd.yaml",
        description="Print the JSON Schema (draft-07) generated from the KV-cache settings "
        "and the method registry; schemas/veloxd.schema.json holds the same text.",
    )
    schema.add_argument("--docs", action="store_true", help="print the Markdown reference tables instead")
    schema.set_defaults(func=run_schema)

    plan = sub.add_parser(
        "plan",
        help="show what applying a config would change in the running daemon",
        description="Compare FILE with the config the running daemon applied (from its "
        "state file; without a running daemon, with an empty state) and list the servers to "
        "start, restart, update in place, stop or keep. Changes nothing.",
    )
    plan.add_argument("file", nargs="?", metavar="FILE", help=f"config file (default: {CONFIG_DEFAULT})")
    state_dir_arg(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=run_plan)


def run_check(args: argparse.Namespace) -> int:
    from veloxd.config.loader import inspect_config

    path = args.file or str(default_config_path())
    result = inspect_config(path)
    valid = result.config is not None
    warnings = [_warning_line(w) for w in result.warnings]
    warnings += [_ineffective_line(w) for w in result.ineffective]
    warnings += _not_downloaded(path, result.servers, result.spans)
    if args.json:
        print(
            json.dumps({"valid": valid, "errors": [i.to_dict() for i in result.issues], "warnings": warnings}, indent=2)
        )
    elif result.config is not None and args.effective:
        from veloxd.config.dump import dump_yaml
        from veloxd.config.roundtrip import config_to_dict

        document = config_to_dict(result.config)
        header = f"# effective config of {document.pop('source')} (sha256 {document.pop('sha256')})\n"
        sys.stdout.write(header + dump_yaml(document))
    elif result.config is not None:
        dashboard = result.config.dashboard
        shown = f"; dashboard on {dashboard.host}:{dashboard.port}" if dashboard is not None else ""
        print(f"{path}: valid; {_servers_line(result.config)}{shown}")
        for warning in warnings:
            print(warning, file=sys.stderr)
        _warn_memory(result.config)
    else:
        # Every mistake at once: the errors, then the warnings of the entries that did parse.
        for line in [*map(str, result.issues), *warnings]:
            print(line, file=sys.stderr)
    if valid:
        if args.strict and warnings:
            count = len(warnings)
            # Only conditions of the world make servers wait; a key that does nothing makes none wait.
            waits = "" if result.ineffective else " and the daemon makes only those servers wait"
            print(
                f"{path}: --strict: failing on {count} warning{'s' if count != 1 else ''} (above); "
                f"without --strict the file is valid{waits}",
                file=sys.stderr,
            )
            return EXIT_INVALID
        return EXIT_VALID
    return EXIT_UNREADABLE if result.unreadable else EXIT_INVALID


def _warning_line(issue: Any) -> str:
    """A condition of the world (veloxd.config.world), located like an error but only a warning."""
    return (
        f"{issue.file}:{issue.line}:{issue.column}: warning: {issue.message}; the daemon keeps this server "
        f"waiting until that changes (at {issue.path})"
    )


def _ineffective_line(issue: Any) -> str:
    """A valid key that does nothing where it is written (veloxd.config.gateway_checks): a warning."""
    return f"{issue.file}:{issue.line}:{issue.column}: warning: {issue.message} (at {issue.path})"


def _not_downloaded(path: str, servers: Any, spans: dict[tuple, Any]) -> list[str]:
    """A located warning per Hugging Face model not yet complete in the cache its server would read."""
    from veloxd.config.validate import locate
    from veloxd.daemon.process import worker_env
    from veloxd.download.cache import hub_cache_dir, is_hub_model, local_snapshot

    out = []
    for name, entry in servers.items():
        env = worker_env(entry.env)
        if is_hub_model(entry.model) and local_snapshot(entry.model, env) is None:
            where = locate(path, spans, ("servers", name, "model"), "")
            out.append(
                f"{where.file}:{where.line}:{where.column}: warning: model {entry.model} is not downloaded yet "
                f"(cache {hub_cache_dir(env)}); the daemon fetches it before the first start, or run "
                f"`veloxd pull {name}` now (at {where.path})"
            )
    return out


def run_schema(args: argparse.Namespace) -> int:
    if args.docs:
        from veloxd.config.docs import render_markdown

        sys.stdout.write(render_markdown())
    else:
        from veloxd.config.schema import schema_text

        sys.stdout.write(schema_text())
    return EXIT_VALID


def run_plan(args: argparse.Namespace) -> int:
    from veloxd.config.loader import inspect_config
    from veloxd.config.plan import diff

    path = args.file or str(default_config_path())
    result = inspect_config(path)
    if result.config is None:
        for issue in result.issues:
            print(issue, file=sys.stderr)
        return EXIT_UNREADABLE if result.unreadable else EXIT_INVALID
    state_dir = args.state_dir or default_state_dir()
    try:
        current, against = _applied_config(state_dir)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"veloxd plan: cannot read the daemon state in {state_dir}: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    plan = diff(current, _redacted(result.config) if current is not None else result.config)
    dashboard = _dashboard_change(current.dashboard if current is not None else None, result.config.dashboard)
    if args.json:
        print(json.dumps({"file": path, "against": against, **plan.to_dict(), "dashboard": dashboard}, indent=2))
        return EXIT_VALID
    print(f"plan for {path}: {against}")
    entries = result.config.supervised()
    for name in plan.added:
        e = entries[name]
        when = "known    (start: on_demand, on its first request)" if e.start == "on_demand" else "start   "
        print(f"  + {name:<20} {when} ({_method_text(e)} on {e.host}:{e.port})")
    for name, keys in plan.changed.items():
        print(f"  ~ {name:<20} restart  ({', '.join(keys)})")
    for name, keys in plan.updated.items():
        print(f"  ~ {name:<20} update   ({', '.join(keys)})")
    for name in plan.removed:
        print(f"  - {name:<20} stop")
    for name in plan.unchanged:
        print(f"  = {name:<20} unchanged")
    if dashboard is not None:
        block = result.config.dashboard
        where = f"({block.host}:{block.port})" if block is not None else ""
        sign = {"start": "+", "restart": "~", "stop": "-", "unchanged": "="}[dashboard]
        print(f"  {sign} {'(dashboard)':<20} {dashboard:<8} {where}".rstrip())
    acted = dashboard if dashboard in ("start", "restart", "stop") else None
    print(plan.summary() + (f"; the dashboard to {acted}" if acted else ""))
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


def _applied_config(state_dir: Path) -> tuple[Any, str]:
    """The config the running daemon applied (from its state file), and a note saying what was compared."""
    from veloxd.config.roundtrip import config_from_dict

    state = _optional("veloxd.daemon.statefile", "read_state", "veloxd.daemon.state")
    state = state(state_dir) if state else None
    alive = _optional("veloxd.daemon.views", "daemon_alive")
    if not state or not state.get("config") or (alive is not None and not alive(state)):
        return None, "no running daemon found; planning against an empty state"
    current = config_from_dict(state["config"])
    return current, f"against the config the running daemon applied ({state.get('config_path') or current.source})"


def _optional(module_name: str, attribute: str, *fallbacks: str) -> Any:
    """`module.attribute` from the first of the daemon's modules that has it; None before they exist."""
    for name in (module_name, *fallbacks):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name not in (name, "veloxd.daemon"):
                raise
            continue
        if hasattr(module, attribute):
            return getattr(module, attribute)
    return None


def _method_text(entry: Any) -> str:
    from veloxd.kv import registry

    if entry.method not in registry.names():  # the gateway
        return str(entry.method)
    text = f"{entry.method} {entry.kv.bits}-bit" if registry.get(entry.method).bits_choices else entry.method
    if entry.distributed is not None:
        from veloxd.distributed.command import describe

        text += f", {describe(entry.distributed)}"
    return text


def _warn_memory(config: Any) -> None:
    """Servers that always run but do not fit the memory budget: a warning, not an error."""
    from veloxd.checks import gib
    from veloxd.daemon.memory import offline_table

    if config.gateway is None:  # the memory budget is the gateway's
        return
    table = offline_table(config, default_state_dir())
    over = table["always_over_budget"]
    if over:
        need = sum(r["total"] or 0 for r in table["servers"].values() if r["start"] == "always")
        print(
            f"warning: the servers with start: always need {gib(need)} together, more than the memory budget "
            f"{gib(table['budget'])} ({table['budget_source']}); over budget from: {', '.join(over)}. "
            "`veloxd plan` shows the memory table.",
            file=sys.stderr,
        )


def _servers_line(config: Any) -> str:
    servers = config.servers
    if not servers:
        return "no servers"
    listed = ", ".join(f"{name} ({_method_text(e)} on {e.host}:{e.port})" for name, e in servers.items())
    return f"{len(servers)} server{'s' if len(servers) != 1 else ''}: {listed}"
