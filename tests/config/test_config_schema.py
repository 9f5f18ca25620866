"""The schema is generated from KVCacheConfig and the registry, checked in, and closed everywhere."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.config_support import entry, issues, write_config
from veloxd.config.docs import render_markdown
from veloxd.config.keys import yaml_fields
from veloxd.config.model import ServerEntry
from veloxd.config.schema import build_schema, schema_text
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, KVCacheConfig, override_fields_for, setting, settings

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "schemas" / "veloxd.schema.json"


def test_checked_in_schema_is_the_generated_one() -> None:
    assert CHECKED_IN.read_text(encoding="utf-8") == schema_text(), "run `make schema` to regenerate it"


def test_schema_is_valid_draft_07() -> None:
    schema = json.loads(CHECKED_IN.read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


def _subschemas(node: Any, where: str = "#") -> Iterator[tuple[str, dict]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _subschemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _subschemas(value, f"{where}/{i}")


def test_every_object_is_closed_and_every_key_documented() -> None:
    schema = build_schema()
    objects = [(w, s) for w, s in _subschemas(schema) if s.get("type") == "object"]
    assert len(objects) >= 6
    for where, sub in objects:
        # false, or a schema for free-form maps (server names, environment variables)
        assert "additionalProperties" in sub and sub["additionalProperties"] is not True, where
        for key, spec in sub.get("properties", {}).items():
            described = spec.get("description") or schema["definitions"].get(
                spec.get("$ref", "").rsplit("/", 1)[-1], {}
            ).get("description")
            assert described, f"{where}/properties/{key} has no description"


def test_defaults_come_from_the_dataclasses() -> None:
    props = build_schema()["definitions"]["server"]["properties"]
    assert props["host"]["default"] == "127.0.0.1" and props["ready_timeout_s"]["default"] == 600.0
    assert props["restart"]["default"] == {
        "max_failures": 5,
        "window_s": 300.0,
        "backoff_initial_s": 1.0,
        "backoff_max_s": 60.0,
    }
    assert props["sampling"]["properties"]["max_tokens"]["default"] == 512
    for f in yaml_fields(ServerEntry):
        if f.default is not dataclasses.MISSING and "schema" in f.metadata:
            assert props[f.name]["default"] == f.default, f.name


def _rule(schema: dict, method: str) -> dict:
    [rule] = [
        r["then"]["properties"]
        for r in schema["definitions"]["server"]["allOf"]
        if r["if"]["properties"]["method"]["const"] == method
    ]
    return rule


def test_each_method_allows_exactly_its_fields_with_their_constraints() -> None:
    schema = build_schema()
    definitions = schema["definitions"]
    assert schema["definitions"]["server"]["properties"]["method"]["enum"] == list(registry.names())
    for method in registry.names():
        rule = _rule(schema, method)
        assert rule["overrides"]["additionalProperties"] is False
        assert list(rule["overrides"]["properties"]) == list(override_fields_for(method))
        info = registry.get(method)
        if info.bits_choices:
            assert rule["bits"]["enum"] == [*info.bits_choices, None]
        else:
            assert rule["bits"]["not"] == {}
        assert ("not" in rule["seed"]) == (method not in KVCacheConfig.__dataclass_fields__["seed"].metadata["methods"])
    for f in settings():
        spec = definitions[f"kv_{f.name}"]
        meta = f.metadata
        assert spec["default"] == f.default
        assert spec.get("minimum") == meta["minimum"] and spec.get("maximum") == meta["maximum"]
        if meta["choices"]:
            assert [c for c in spec["enum"] if c is not None] == list(meta["choices"])


@dataclasses.dataclass(frozen=True)
class _WithNewField(KVCacheConfig):
    kivi_new_knob: int = setting(
        7, methods=("kivi", "h2o"), kind=int, minimum=1, maximum=9, help="A setting added after the schema was written."
    )


def test_a_new_field_reaches_the_schema_and_the_checker_without_other_edits(tmp_path: Path) -> None:
    fields = [f for f in dataclasses.fields(_WithNewField) if f.name != "method"]
    schema = build_schema(fields=fields)
    assert schema["definitions"]["kv_kivi_new_knob"]["maximum"] == 9
    assert "kivi_new_knob" in _rule(schema, "kivi")["overrides"]["properties"]
    assert "kivi_new_knob" in _rule(schema, "h2o")["overrides"]["properties"]
    assert "kivi_new_knob" not in _rule(schema, "affine")["overrides"]["properties"]
    validator = jsonschema.Draft7Validator(schema)
    base: dict[str, Any] = {"version": 1, "servers": {"a": {"model": "m/x", "port": 1, "method": "kivi"}}}
    base["servers"]["a"]["overrides"] = {"kivi_new_knob": 5}
    assert validator.is_valid(base)
    base["servers"]["a"]["overrides"] = {"kivi_new_knob": 10}
    assert {e.validator for e in validator.iter_errors(base)} == {"maximum"}
    base["servers"]["a"]["method"] = "affine"
    base["servers"]["a"]["overrides"] = {"kivi_new_knob": 5}
    assert [e.validator for e in validator.iter_errors(base)] == ["additionalProperties"]


@pytest.mark.parametrize("f", settings(), ids=lambda f: f.name)
def test_checker_enforces_every_field_from_its_metadata(tmp_path: Path, f: dataclasses.Field) -> None:
    """Built from the metadata alone: a field added to KVCacheConfig is covered here automatically."""
    owner = f.metadata["methods"][0]
    outsider = next(m for m in registry.names() if m not in f.metadata["methods"])
    key = f"overrides: {{{f.name}: __}}" if f.name not in OWN_KEYS else f"{f.name}: __"
    good = registry.get(owner).bits_choices[0] if f.name == "bits" else f.default
    good_text = json.dumps(good)
    path = write_config(
        tmp_path, entry(f"model: m/x\nport: 8081\nmethod: {outsider}\n" + key.replace("__", good_text)), dedent=False
    )
    [(_, _, where, message)] = issues(path)
    assert where.endswith(f.name) and outsider in message
    meta = f.metadata
    if meta["maximum"] is not None:
        bad: Any = meta["maximum"] + 1
    elif meta["choices"]:
        bad = "not-" + "-".join(map(str, meta["choices"])) if meta["kind"] is str else max(meta["choices"]) + 1
    else:
        bad = 12345 if meta["kind"] in (bool, str) else "not-a-number"
    path = write_config(
        tmp_path, entry(f"model: m/x\nport: 8081\nmethod: {owner}\n" + key.replace("__", json.dumps(bad))), dedent=False
    )
    [(_, _, where, message)] = issues(path)
    assert where.endswith(f.name) and f.name in message


def test_docs_tables_list_every_method_field_and_key() -> None:
    text = render_markdown()
    for name in registry.names():
        assert f"| `{name}` |" in text
    for f in settings():
        assert f"| `{f.name}` (" in text and f.metadata["help"] in text
    for key in build_schema()["definitions"]["server"]["properties"]:
        assert f"| `{key}`" in text
    assert "| `restart.backoff_max_s` |" in text
