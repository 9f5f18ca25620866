"""How a config dataclass declares its YAML keys, and the key schemas shared by every block.

`key` and `section` put each key's default, description and JSON Schema constraints on the
dataclass field (veloxd.config.schema and the docs read them there); `yaml_fields` lists them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any

from veloxd.checks import HOST_PATTERN, SIZE_PATTERN, parse_size

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Schemas of keys that mean the same wherever they stand (servers, dashboard, gateway), defined
# once so that the blocks accept the same values.
HOST_SCHEMA = {"type": "string", "pattern": HOST_PATTERN, "maxLength": 253}
PORT_SCHEMA = {"type": "integer", "minimum": 1, "maximum": 65535}
API_KEY_ENV_SCHEMA = {"type": ["string", "null"], "pattern": ENV_NAME_PATTERN}
ENV_SCHEMA = {
    "type": "object",
    "propertyNames": {"pattern": ENV_NAME_PATTERN},
    "additionalProperties": {"type": "string"},
}
SIZE_SCHEMA = {"type": ["integer", "string"], "minimum": 1, "pattern": SIZE_PATTERN}
SIZE_OR_NULL_SCHEMA = {"type": ["integer", "string", "null"], "minimum": 1, "pattern": SIZE_PATTERN}


def size_or_none(value: int | str | None) -> int | None:
    """The `convert` of a size key that may be unset."""
    return None if value is None else parse_size(value)


def key(
    default: Any = MISSING,
    *,
    help: str,
    schema: dict[str, Any],
    live: bool = False,
    factory: Callable[[], Any] | Any = MISSING,
    convert: Callable[[Any], Any] | None = None,
) -> Any:
    """A YAML key: default, description, JSON Schema constraints; `live` keys change without a restart."""
    meta = {"help": help, "schema": schema, "live": live, "convert": convert}
    return field(default=default, default_factory=factory, metadata=meta)


def section(cls: type, *, help: str, live: bool = False, optional: bool = False) -> Any:
    """A nested mapping of keys, itself a dataclass declared with `key`; `optional`: absent (None) by default."""
    meta = {"help": help, "section": cls, "live": live, "optional": optional}
    return field(default=None, metadata=meta) if optional else field(default_factory=cls, metadata=meta)


def yaml_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The dataclass fields that are YAML keys (or, for `kv`, stand for method/bits/seed/overrides)."""
    return tuple(f for f in dataclasses.fields(cls) if f.metadata)
