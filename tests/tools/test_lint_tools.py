"""The lint checks of tools/: each finds what it is for, on a small package written here."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tools.import_cycles import find_cycle, import_graph
from tools.long_functions import LIMIT, long_functions


def package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    pkg = package(tmp_path, {"a.py": "from pkg import b\n", "b.py": "def f():\n    from pkg.a import x\n"})
    cycle = find_cycle(import_graph(pkg))
    assert cycle is not None and set(cycle) == {"pkg.a", "pkg.b"}


def test_a_type_checking_import_counts_and_relative_imports_resolve(tmp_path: Path) -> None:
    files = {
        "sub/__init__.py": "",
        "sub/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "sub/b.py": "from pkg.sub import a\n",
    }
    cycle = find_cycle(import_graph(package(tmp_path, files)))
    assert cycle is not None and set(cycle) == {"pkg.sub.a", "pkg.sub.b"}


def test_layers_without_a_cycle_pass(tmp_path: Path) -> None:
    pkg = package(tmp_path, {"a.py": "import json\nfrom pkg import b\n", "b.py": "from pkg.c import x\n", "c.py": ""})
    assert find_cycle(import_graph(pkg)) is None


def test_a_long_function_needs_a_reason(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    path = tmp_path / "m.py"
    path.write_text(
        f"def short():\n    return 1\n\n\ndef long():\n{body}\n\n\ndef explained():\n    '''Long: a table.'''\n{body}\n"
    )
    assert [line.split(": ")[1].split()[0] for line in long_functions(path)] == ["long"]
