"""`veloxd check` and `veloxd schema`: argument handling and output only."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

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


def method_text(entry: Any) -> str:
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
    listed = ", ".join(f"{name} ({method_text(e)} on {e.host}:{e.port})" for name, e in servers.items())
    return f"{len(servers)} server{'s' if len(servers) != 1 else ''}: {listed}"
