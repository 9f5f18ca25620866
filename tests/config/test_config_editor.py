"""An editor's view: the checked-in schema with plain PyYAML + jsonschema (no veloxd code) agrees with `check`."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.config_support import FIELD_CASES, entry, issues, write_config

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "schemas" / "veloxd.schema.json").read_text(encoding="utf-8"))


def editor_places(text: str) -> set[str]:
    """JSON paths an editor underlines, from the schema file alone."""
    places = set()
    for err in jsonschema.Draft7Validator(SCHEMA).iter_errors(yaml.safe_load(text)):
        path = list(err.absolute_path)
        if "propertyNames" in err.relative_schema_path:
            path.append(err.instance)
        elif err.validator == "additionalProperties":
            allowed = err.schema.get("properties", {})
            path.append(next(k for k in err.instance if k not in allowed and not k.startswith("x-")))
        elif err.validator == "required":
            path.append(next(k for k in err.validator_value if k not in err.instance))
        places.add("$" + "".join(f".{p}" for p in path))
    return places


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_editor_flags_the_same_places_as_check(tmp_path: Path, text: str, expected: list) -> None:
    veloxd_places = {path for _, _, path, _ in issues(write_config(tmp_path, text, dedent=False))}
    assert veloxd_places == {path for _, _, path, _ in expected}
    assert editor_places(text) == veloxd_places


def test_editor_accepts_what_check_accepts(tmp_path: Path) -> None:
    text = entry(
        "model: mlx-community/Qwen2.5-Coder-7B-Instruct-4bit\nport: 8081\nmethod: kivi\nbits: 2\n"
        "overrides: {kivi_group_size: 64}\nprompt_cache: {bytes: 4G}\nrestart: {max_failures: 3}"
    )
    assert editor_places(text) == set()
    from veloxd.config import load_config

    assert load_config(write_config(tmp_path, text, dedent=False)).servers["coder"].kv.kivi_group_size == 64


def test_semantic_rules_are_beyond_the_schema(tmp_path: Path) -> None:
    """Clashing ports are only caught by `check` (same file, editor says valid); a path that does not exist
    is a condition of the world, not of the file: not an error at all."""
    text = entry("model: ./missing\nport: 8081\nmethod: fp16") + "  other: {model: ./model, port: 8081, method: fp16}\n"
    assert editor_places(text) == set()
    assert [path for _, _, path, _ in issues(write_config(tmp_path, text, dedent=False))] == ["$.servers.other.port"]
