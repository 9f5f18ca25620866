"""`veloxd gateway`: internal; the daemon runs it for a config with a `gateway:` block (docs/gateway.md)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gateway",
        help="(internal) the gateway process: one OpenAI endpoint for every server; the daemon runs it for a "
        "`gateway:` block",
        description="The gateway process; the daemon starts it for a config with a "
        "`gateway:` block (docs/gateway.md). Not meant to be run by hand.",
    )
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--lifeline-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from veloxd.gateway.main import run as run_gateway

    return run_gateway(args.host, args.port, args.lifeline_fd)
