"""How a config dataclass declares its YAML keys, and the key schemas shared by every block.

`key` and `section` put each key's default, description and JSON Schema constraints on the
dataclass field (veloxd.config.schema and the docs read them there); `yaml_fields` lists them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any

from veloxd import entry_bounds
from veloxd.checks import HOST_PATTERN, SIZE_PATTERN, parse_size

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Schemas of keys that mean the same wherever they stand (servers, dashboard, gateway), defined
# once so that the blocks accept the same values.
HOST_SCHEMA = {"type": "string", "pattern": HOST_PATTERN, "maxLength": 253}
PORT_SCHEMA = entry_bounds.PORT
API_KEY_ENV_SCHEMA = {"type": ["string", "null"], "pattern": ENV_NAME_PATTERN}
ENV_SCHEMA = {
    "type": "object",
    "propertyNames": {"pattern": ENV_NAME_PATTERN},
    "additionalProperties": {"type": "string"},
}
PATH_OR_NULL_SCHEMA = {"type": ["string", "null"], "minLength": 1}
_SIZE_SCHEMA = {"type": ["integer", "string"], "minimum": 1, "pattern": SIZE_PATTERN}
_SIZE_OR_NULL_SCHEMA = {"type": ["integer", "string", "null"], "minimum": 1, "pattern": SIZE_PATTERN}


def seconds(maximum: float, *, minimum: float = 0, nullable: bool = False) -> dict[str, Any]:
    """The schema of a duration: seconds above 0 (or at least `minimum`), at most `maximum`; `nullable`: may be unset."""
    low = {"minimum": minimum} if minimum else {"exclusiveMinimum": 0}
    return {"type": ["number", "null"] if nullable else "number", **low, "maximum": maximum}


def _size_or_none(value: int | str | None) -> int | None:
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


def size_key(default: int | None, *, help: str, live: bool = False) -> Any:
    """A byte size: an integer or text such as '512MB' (the schema checks the pattern, parse_size the
    value, on load); a None default makes it optional. `size_paths` finds these keys."""
    if default is None:
        return key(None, help=help, schema=_SIZE_OR_NULL_SCHEMA, live=live, convert=_size_or_none)
    return key(default, help=help, schema=_SIZE_SCHEMA, live=live, convert=parse_size)


def section(cls: type, *, help: str, live: bool = False, optional: bool = False) -> Any:
    """A nested mapping of keys, itself a dataclass declared with `key`; `optional`: absent (None) by default."""
    meta = {"help": help, "section": cls, "live": live, "optional": optional}
    return field(default=None, metadata=meta) if optional else field(default_factory=cls, metadata=meta)


def yaml_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The dataclass fields that are YAML keys (or, for `kv`, stand for method/bits/seed/overrides)."""
    return tuple(f for f in dataclasses.fields(cls) if f.metadata)


def size_paths(cls: type) -> tuple[tuple[str, ...], ...]:
    """The paths of `cls`'s size keys (`size_key`), those of its sections included, in declaration order."""
    paths: list[tuple[str, ...]] = []
    for f in yaml_fields(cls):
        if f.metadata.get("convert") in (parse_size, _size_or_none):
            paths.append((f.name,))
        elif "section" in f.metadata:
            paths.extend((f.name, *path) for path in size_paths(f.metadata["section"]))
    return tuple(paths)
