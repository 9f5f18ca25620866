"""The command table: each module registers exactly the commands listed for it, and a named command
builds a parser with only its own module's commands (a worker's start does not import the daemon's)."""

from __future__ import annotations

import argparse
import importlib

from tests.support import run_python
from veloxd.cli import COMMANDS, build_parser


def registered(module: str) -> list[str]:
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(sub)
    return list(sub.choices)


def test_every_module_registers_exactly_its_listed_commands() -> None:
    for module in dict.fromkeys(COMMANDS.values()):
        assert registered(module) == [name for name, owner in COMMANDS.items() if owner == module], module


def test_the_full_parser_lists_every_command_in_table_order() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subparsers.choices) == list(COMMANDS)


def test_a_named_command_imports_only_its_own_module() -> None:
    result = run_python(
        "import sys\n"
        "from veloxd.cli import build_parser\n"
        "parser = build_parser('serve')\n"
        "print(sorted(m for m in sys.modules if m.startswith('veloxd.cli.')))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['veloxd.cli.serve']"


def test_an_unknown_command_is_refused_with_the_full_list() -> None:
    result = run_python("from veloxd.cli import main; main(['serv'])")
    assert result.returncode == 2
    assert "invalid choice: 'serv'" in result.stderr
    assert all(f"'{name}'" in result.stderr for name in COMMANDS), result.stderr
