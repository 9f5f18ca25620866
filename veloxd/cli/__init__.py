"""The `veloxd` command line: subcommands only, no logic beyond argument handling.

Each module in COMMANDS has `register(subparsers)`, which adds its subcommands with
`set_defaults(func=run)`; `run(args) -> int` is the exit code. Command modules import
nothing heavy at top level (no mlx), so `veloxd check` stays fast, and a named command imports
only its own module (a worker's start pays for `veloxd serve`'s parser, not the daemon's).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from veloxd import __version__

# Each command and the module that registers it, in `veloxd --help`'s order (a test checks that
# every module registers exactly the commands listed for it).
COMMANDS = {
    "serve": "veloxd.cli.serve",
    "methods": "veloxd.cli.methods",
    "check": "veloxd.cli.config",
    "schema": "veloxd.cli.config",
    "plan": "veloxd.cli.plan",
    "run": "veloxd.cli.daemon",
    "status": "veloxd.cli.daemon",
    "reload": "veloxd.cli.daemon",
    "restart": "veloxd.cli.daemon",
    "logs": "veloxd.cli.daemon",
    "install": "veloxd.cli.service",
    "uninstall": "veloxd.cli.service",
    "pull": "veloxd.cli.pull",
    "web": "veloxd.cli.web",  # internal: the dashboard process
    "gateway": "veloxd.cli.gateway",  # internal: the daemon runs it
}


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser that refuses its own unknown arguments. argparse's subparsers parse with
    parse_known_args and hand the leftovers up to the top-level parser, whose error then shows
    `veloxd`'s usage instead of the command's (`veloxd check --bogus` would not show check's options)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or, for a known command, one with only its module's subcommands."""
    parser = argparse.ArgumentParser(
        prog="veloxd",
        description="Serve several MLX models at once, each with a compressed KV cache, from one YAML file.",
    )
    parser.add_argument("--version", action="version", version=f"veloxd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
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
