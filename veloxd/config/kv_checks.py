"""KVCacheConfig's rules on one entry's KV settings, each setting and rule on its own: every mistake at once.

Building the KVCacheConfig would stop at its first error, and not run at all when any key of the
entry failed the schema; here a setting the schema refused is only left out of the rules that
read it, so the others still get their verdict.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from veloxd.config.codec import whole_as_int
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, settings
from veloxd.kv.config_rules import KVConfigError, broken_rules, check_setting

Problems = list[tuple[tuple, str]]  # (path inside the entry, message), as veloxd.config.semantic


def kv_problems(raw: dict[str, Any], refused: AbstractSet[tuple]) -> Problems:
    """What KVCacheConfig's own rules say of `raw`'s KV settings; `refused` holds the paths inside
    the entry the schema already reported (their values are not checked again)."""
    method = raw.get("method")
    if ("method",) in refused or not isinstance(method, str) or method not in registry.names():
        return []  # which rules apply depends on the method: the schema said why it is wrong
    written = _written(raw, refused)
    fields = {f.name: f for f in settings()}
    problems: Problems = []
    invalid = {name for name in fields if _path(name) in refused}
    for name, value in written.items():
        try:
            check_setting(fields[name], value, method)
        except KVConfigError as err:  # the schema is generated from the same metadata: a backstop
            problems.append((_path(name), err.message))
            invalid.add(name)
    values = {name: f.default for name, f in fields.items()}
    values.update({name: value for name, value in written.items() if name not in invalid})
    for rule in broken_rules({"method": method, **values}, invalid):
        problems.append((kv_error_path(rule.field, raw), rule.message))
    return problems


def _written(raw: dict[str, Any], refused: AbstractSet[tuple]) -> dict[str, Any]:
    """The KV settings `raw` writes (own keys and overrides), without those the schema refused."""
    names = {f.name for f in settings()}
    overrides = raw.get("overrides")
    found = dict(overrides) if isinstance(overrides, dict) and ("overrides",) not in refused else {}
    found = {name: value for name, value in found.items() if name in names and name not in OWN_KEYS}
    found.update({own: raw[own] for own in OWN_KEYS if raw.get(own) is not None})
    return {name: whole_as_int(value) for name, value in found.items() if _path(name) not in refused}


def _path(name: str) -> tuple:
    return (name,) if name in OWN_KEYS else ("overrides", name)


def kv_error_path(field: str, data: dict[str, Any]) -> tuple:
    """Where an entry writes the KV setting `field`: its own key, inside overrides, else the nearest key."""
    overrides = data.get("overrides") or {}
    if isinstance(overrides, dict) and field in overrides:
        return ("overrides", field)
    if (field in OWN_KEYS or field == "method") and field in data:
        return (field,)
    return ("overrides",) if "overrides" in data else ("method",)
