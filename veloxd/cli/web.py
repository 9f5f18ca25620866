"""`veloxd web`: the dashboard process (internal: the daemon starts it for a `dashboard:` block)."""

from __future__ import annotations

import argparse
import dataclasses

from veloxd import paths
from veloxd.cli.daemon import state_dir_arg
from veloxd.config.sections import Dashboard


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "web",
        help="(internal) the dashboard and /metrics process; the daemon runs it for a `dashboard:` block",
        description="Serve the dashboard, its JSON API and Prometheus /metrics for the daemon of --state-dir. "
        "The daemon starts this for the `dashboard:` block of veloxd.yaml; run by hand only to debug it.",
    )
    state_dir_arg(p)  # the daemon's own flag: the dashboard reads the state of the daemon it names
    # The defaults are the `dashboard:` block's (veloxd.config.sections.Dashboard).
    p.add_argument("--host", default=Dashboard.host, help=f"loopback address to bind (default {Dashboard.host})")
    p.add_argument("--port", type=int, default=Dashboard.port, help=f"port to bind (default {Dashboard.port})")
    p.add_argument(
        "--interval-s",
        type=float,
        default=Dashboard.interval_s,
        help=f"seconds between samples (default {Dashboard.interval_s:g})",
    )
    p.add_argument(
        "--history",
        type=int,
        default=Dashboard.history,
        help=f"samples kept for the charts (default {Dashboard.history})",
    )
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the bearer token for actions")
    p.add_argument("--lifeline-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from veloxd.web.main import WebOptions, main

    state_dir = (args.state_dir or paths.default_state_dir()).expanduser().absolute()
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(WebOptions) if f.name != "state_dir"}
    return main(WebOptions(state_dir=state_dir, **flags))  # every other field is the flag of its name
