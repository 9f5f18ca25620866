"""How `make test` spreads tests over the xdist workers (`--dist loadgroup`, tests/conftest.py).

Test by test, so that a long module does not leave the other worker idle at the end of a run; but
the tests of a module that share a module-scoped fixture (a started worker, a daemon, a browser)
stay on one worker, so that the fixture is set up once. xdist's `xdist_group` marker means the
same, but pytest 9.2's node ids no longer take the group suffix xdist appends to them, so the
groups are decided here, in the controller, from the source of each module and of the test
modules it imports fixtures from.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]  # pytest-xdist ships no types, typeshed has no stubs

ROOT = Path(__file__).resolve().parents[1]
MODULE_FIXTURE = re.compile(r"""@pytest\.fixture\(\s*scope\s*=\s*["']module["'][^)]*\)\s*\ndef (\w+)""")
TEST_IMPORT = re.compile(r"^from (tests(?:\.\w+)+) import", re.M)
SIGNATURE = re.compile(r"^\s*def \w+\(([^)]*)\)", re.M)  # a test's or a fixture's parameters


def _source(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


@cache
def shares_module_fixture(module: str) -> bool:
    """Whether the tests of `module` (a path relative to the repository) may share a module-scoped
    fixture: one defined in it, or one it names that a test module it imports from or a conftest.py
    above it defines."""
    path = ROOT / module
    text = _source(path)
    if MODULE_FIXTURE.search(text):
        return True
    elsewhere = [_source(ROOT / (name.replace(".", "/") + ".py")) for name in TEST_IMPORT.findall(text)]
    elsewhere += [_source(parent / "conftest.py") for parent in path.parents if parent.is_relative_to(ROOT / "tests")]
    names = {name for source in elsewhere for name in MODULE_FIXTURE.findall(source)}
    parameters = [re.split(r"\s*[:=]", p.strip())[0] for sig in SIGNATURE.findall(text) for p in sig.split(",")]
    return bool(names & set(parameters))


class ModuleOrTest(LoadScopeScheduling):
    """xdist's scope scheduler whose scope is the module where a module fixture is shared, else
    the test itself."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if shares_module_fixture(module) else nodeid
