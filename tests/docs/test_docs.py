"""docs/reference.md's tables are generated, never hand-edited: they must match the code."""

from __future__ import annotations

from tests.support import REPO
from veloxd.config.docs import with_generated_section


def test_readme_generated_section_matches_the_registry_and_config() -> None:
    readme = (REPO / "docs" / "reference.md").read_text()
    assert readme == with_generated_section(readme), "run `make schema` to refresh docs/reference.md"


def test_readme_documents_every_method_and_field() -> None:
    from veloxd.kv import registry
    from veloxd.kv.config import settings

    readme = (REPO / "docs" / "reference.md").read_text()
    for name in registry.names():
        assert f"`{name}`" in readme
    for f in settings():
        assert f"`{f.name}`" in readme


def test_readme_links_every_docs_page_and_stays_short() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) < 15_000, "README.md should stay under 15 KB: move detail to docs/"
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
