"""Fails on a function longer than the limit whose docstring gives no reason (`make lint` runs it).

A long function is usually several jobs; where one job really is long (a table of routes, a
state machine's dispatch), its docstring says so in a line starting with "Long:".
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

LIMIT = 80  # lines, from `def` to the last line of the body


def long_functions(path: Path, limit: int = LIMIT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
            continue
        length = node.end_lineno - node.lineno + 1
        reason = any(line.strip().startswith("Long:") for line in (ast.get_docstring(node) or "").splitlines())
        if length > limit and not reason:
            found.append(
                f"{path}:{node.lineno}: {node.name} is {length} lines (over {limit}; split it, or say why in a 'Long:' docstring line)"
            )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    args = parser.parse_args(argv)
    found = [line for path in sorted(args.package.rglob("*.py")) for line in long_functions(path)]
    print("\n".join(found), file=sys.stderr) if found else print(f"no function over {LIMIT} lines without a reason")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
