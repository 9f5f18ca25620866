"""Finds uses of mlx_lm's private names in Python source (for the one-door contract test).

A use is an import of an underscore name from an mlx_lm module, or an attribute `._name` where
`_name` is a private attribute mlx_lm itself defines (collected from its source) and the file
does not define that name for itself (veloxd's own `self._lock` is not mlx_lm's).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import mlx_lm


def _defined_private_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef) and node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id.startswith("_"):
            names.add(node.id)
    return {name for name in names if not (name.startswith("__") and name.endswith("__"))}


@cache
def mlx_lm_private_names() -> frozenset[str]:
    root = Path(mlx_lm.__file__).parent
    names: set[str] = set()
    for path in root.rglob("*.py"):
        names |= _defined_private_names(ast.parse(path.read_text(encoding="utf-8")))
    return frozenset(names)


def scan_source(source: str) -> list[tuple[int, str]]:
    """(line, name) of each private mlx_lm name the source uses."""
    tree = ast.parse(source)
    own = _defined_private_names(tree)
    theirs = mlx_lm_private_names()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlx_lm"):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in theirs - own:
            found.append((node.lineno, node.attr))
    return sorted(found)


def private_mlx_lm_uses(package: Path, exclude: set[str]) -> list[str]:
    """`path:line: name` for every use outside the excluded files and folders (paths relative to the
    package; a folder ends with "/")."""
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative in exclude or any(relative.startswith(e) for e in exclude if e.endswith("/")):
            continue
        for line, name in scan_source(path.read_text(encoding="utf-8")):
            offenders.append(f"{relative}:{line}: {name}")
    return offenders
