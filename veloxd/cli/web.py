"""`veloxd web`: the dashboard process (internal: the daemon starts it for a `dashboard:` block)."""

from __future__ import annotations

import argparse
import dataclasses

from veloxd import paths
from veloxd.cli.daemon import state_dir_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "web",
        help="(internal) the dashboard and /metrics process; the daemon runs it for a `dashboard:` block",
        description="Serve the dashboard, its JSON API and Prometheus /metrics for the daemon of --state-dir. "
        "The daemon starts this for the `dashboard:` block of veloxd.yaml; run by hand only to debug it.",
    )
    state_dir_arg(p)  # the daemon's own flag: the dashboard reads the state of the daemon it names
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8090, help="port to bind (default 8090)")
    p.add_argument("--interval-s", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--history", type=int, default=900, help="samples kept for the charts (default 900)")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the bearer token for actions")
    p.add_argument("--lifeline-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from veloxd.web.main import WebOptions, main

    state_dir = (args.state_dir or paths.default_state_dir()).expanduser().absolute()
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(WebOptions) if f.name != "state_dir"}
    return main(WebOptions(state_dir=state_dir, **flags))  # every other field is the flag of its name
