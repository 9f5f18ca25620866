"""Markdown reference tables (methods, KV-cache settings, server keys), generated like the schema."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from veloxd.config.schema import build_schema
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, fields_for, settings


def render_markdown() -> str:
    """docs/reference.md's generated section: `veloxd schema --docs`."""
    return "\n".join(
        [
            "## KV-cache methods",
            "",
            methods_table(),
            "",
            "## KV-cache settings (`bits`, `seed`, and `overrides`)",
            "",
            fields_table(),
            "",
            "## Server entry keys",
            "",
            entry_keys_table(),
            "",
            "## Dashboard keys (top-level `dashboard:`; absent: no dashboard; with `gateway:` the gateway serves it)",
            "",
            block_table("dashboard"),
            "",
            "## Gateway keys (`gateway:`, docs/gateway.md)",
            "",
            gateway_keys_table(),
            "",
        ]
    )


def block_table(name: str) -> str:
    """The keys of a top-level block such as `dashboard:`."""
    spec = build_schema()["properties"][name]
    rows = [["key", "type", "default", "description"]]
    for key, sub in spec["properties"].items():
        rows.append([f"`{name}.{key}`", _type(sub), _show(sub.get("default")), sub.get("description", "")])
    return _table(rows)


def methods_table() -> str:
    rows = [["method", "family", "bits (default)", "storage", "batchable", "prefix trim", "overrides"]]
    for name in registry.names():
        m = registry.get(name)
        bits = f"{'/'.join(map(str, m.bits_choices))} ({m.default_bits})" if m.bits_choices else "-"
        fields = [f"`{f}`" for f in fields_for(m.name) if f not in OWN_KEYS]
        rows.append(
            [
                f"`{m.name}`",
                m.family,
                bits,
                m.storage,
                "yes" if m.batchable else "no",
                m.trimmable.replace("_", " "),
                ", ".join(fields) or "-",
            ]
        )
    return _table(rows)


def fields_table() -> str:
    rows = [["setting", "methods", "type", "default", "allowed", "description"]]
    for f in settings():
        meta = f.metadata
        allowed = ", ".join(map(str, meta["choices"])) if meta["choices"] else _range(meta)
        where = "entry key" if f.name in OWN_KEYS else "`overrides`"
        rows.append(
            [
                f"`{f.name}` ({where})",
                ", ".join(meta["methods"]),
                meta["kind"].__name__ + (" or null" if meta["nullable"] else ""),
                _show(f.default),
                allowed,
                meta["help"],
            ]
        )
    return _table(rows)


def entry_keys_table() -> str:
    schema = build_schema()
    server = schema["definitions"]["server"]
    rows = [["key", "type", "default", "description"]]
    for key, spec in server["properties"].items():
        if "$ref" in spec:  # e.g. seed: shared with the per-method rules
            spec = {**schema["definitions"][spec["$ref"].rsplit("/", 1)[-1]], **spec}
        rows.append(
            [
                f"`{key}`" + (" (required)" if key in server["required"] else ""),
                _type(spec),
                _show(spec["default"]) if "default" in spec else "-",
                spec.get("description", ""),
            ]
        )
        if "object" in spec.get("type", ()) and "properties" in spec and key != "overrides":
            for sub, sub_spec in spec["properties"].items():
                rows.append(
                    [f"`{key}.{sub}`", _type(sub_spec), _show(sub_spec.get("default")), sub_spec.get("description", "")]
                )
    return _table(rows)


def gateway_keys_table() -> str:
    gateway = build_schema()["properties"]["gateway"]
    rows = [["key", "type", "default", "description"]]
    for key, spec in gateway["properties"].items():
        rows.append(
            [
                f"`{key}`" + (" (required)" if key in gateway["required"] else ""),
                _type(spec),
                _show(spec["default"]) if "default" in spec else "-",
                spec.get("description", ""),
            ]
        )
    return _table(rows)


def _range(meta: Mapping[str, Any]) -> str:
    low, high = meta["minimum"], meta["maximum"]
    if low is None and high is None:
        return "-"
    return f"{'' if low is None else low}..{'' if high is None else high}"


def _type(spec: dict[str, Any]) -> str:
    kind = spec.get("type", "-")
    return " or ".join(kind) if isinstance(kind, list) else kind


def _show(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "-"
    return f"`{json.dumps(value)}`"


def _table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


START, END = "<!-- generated-docs:start -->\n", "<!-- generated-docs:end -->"


def with_generated_section(readme: str) -> str:
    """`readme` with the text between the generated-docs markers replaced by render_markdown()."""
    if START not in readme or END not in readme:
        raise ValueError("no generated-docs markers in the page")
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}{render_markdown().rstrip()}\n{END}{tail}"


if __name__ == "__main__":  # `make schema` refreshes docs/reference.md's generated section
    import sys
    from pathlib import Path

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/reference.md")
    path.write_text(with_generated_section(path.read_text()))
