"""The `veloxd` command line: subcommands only, no logic beyond argument handling.

Each module in COMMAND_MODULES has `register(subparsers)`, which adds its subcommands with
`set_defaults(func=run)`; `run(args) -> int` is the exit code. Command modules import
nothing heavy at top level (no mlx), so `veloxd check` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from veloxd import __version__

COMMAND_MODULES = (
    "veloxd.cli.serve",  # serve
    "veloxd.cli.methods",  # methods
    "veloxd.cli.config",  # check, schema, plan
    "veloxd.cli.daemon",  # run, status, reload, restart, logs
    "veloxd.cli.service",  # install, uninstall
    "veloxd.cli.pull",  # pull
    "veloxd.cli.web",  # web (internal: the dashboard process)
    "veloxd.cli.gateway",  # gateway (internal: the daemon runs it)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veloxd",
        description="Serve several MLX models at once, each with a compressed KV cache, from one YAML file.",
    )
    parser.add_argument("--version", action="version", version=f"veloxd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`veloxd status | head`): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a process a closed pipe ended
    return code


if __name__ == "__main__":
    raise SystemExit(main())
