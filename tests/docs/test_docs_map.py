"""docs/development.md's map of the tree names every package and top-level module, and nothing gone."""

from __future__ import annotations

import re

from tests.support import REPO


def the_map() -> str:
    text = (REPO / "docs" / "development.md").read_text()
    return text.split("```\n", 2)[1]  # the first fenced block


def named_in_map(block: str) -> set[str]:
    """Each `name/` or `name.py` that starts an entry of the map, as a path under its parent entry."""
    names: set[str] = set()
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = re.match(r"^( *)([A-Za-z_][\w.]*/|[A-Za-z_]\w*\.py)\s", line + " ")
        if not match:
            continue
        depth, name = len(match.group(1)), match.group(2)
        while parents and parents[-1][0] >= depth:
            parents.pop()
        path = "".join(p for _, p in parents) + name
        names.add(path.rstrip("/"))
        if name.endswith("/"):
            parents.append((depth, name))
    return names


def in_tree() -> set[str]:
    """Every package of veloxd/ and benchmarks/, veloxd's top-level modules, and the top folders mapped."""
    found = {"veloxd", "testkit", "tools", "schemas", "configs", "benchmarks", "tests"}
    for root in ("veloxd", "benchmarks"):
        for init in (REPO / root).rglob("__init__.py"):
            package = init.parent.relative_to(REPO).as_posix()
            if package != root:
                found.add(package)
    found |= {
        f"veloxd/{p.name}" for p in (REPO / "veloxd").glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    }
    return found


def test_the_map_names_every_package_and_top_level_module() -> None:
    missing = in_tree() - named_in_map(the_map())
    assert not missing, f"docs/development.md's map does not name {sorted(missing)}"


def test_the_map_names_nothing_that_is_gone() -> None:
    mapped = {name for name in named_in_map(the_map()) if name.count("/") <= 2}
    gone = sorted(name for name in mapped if not (REPO / name).exists())
    assert not gone, f"docs/development.md's map names what is not in the tree: {gone}"
