"""Fails when a package's modules import each other in a cycle (`make lint` runs it on veloxd).

Every import counts, a function-local one too: a cycle that only closes at run time still ties
the modules together. `from pkg import name` counts as an import of `pkg.name` when that is a
module, else of `pkg`. A package's `__init__` is imported implicitly by its submodules; that
implicit edge is not counted (it is not written anywhere).
"""

from __future__ import annotations

import argparse
import ast
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> set[str]:
    """The modules of `known` that `tree` (the source of `module`) imports."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {name for name in found if name in known and name != module}


def import_graph(root: Path) -> dict[str, set[str]]:
    paths = sorted(root.rglob("*.py"))
    known = {module_name(root, path) for path in paths}
    return {
        module_name(root, path): imported(
            module_name(root, path), path.name == "__init__.py", ast.parse(path.read_text(encoding="utf-8")), known
        )
        for path in paths
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        return list(error.args[1])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path, help="the package directory, e.g. veloxd")
    args = parser.parse_args(argv)
    graph = import_graph(args.package.resolve())
    cycles = []
    # Report every cycle, one at a time: cut an edge of each found one and look again.
    while (cycle := find_cycle(graph)) is not None:
        cycles.append(cycle)
        graph[cycle[-2]].discard(cycle[-1])
    for cycle in cycles:
        print(f"import cycle: {' -> '.join(cycle)}", file=sys.stderr)
    if cycles:
        return 1
    print(f"no import cycles in {args.package} ({len(graph)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
