"""Typed entries and sections <-> YAML-shaped plain data, the flat keys a restart is judged by, and
the settings an entry's worker is given (its --entry-json document).

Generic over the dataclasses that declare YAML fields (veloxd.config.keys): `ServerEntry` calls
these for its own `to_dict`, `from_dict`, `process_key` and `live_key`, so this module never
imports the config model (veloxd.config.roundtrip does the whole-file round trip on top).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from veloxd.config.keys import yaml_fields
from veloxd.kv.config import OWN_KEYS, KVCacheConfig, fields_for, override_fields_for


def entry_to_dict(entry: Any) -> dict[str, Any]:
    """The entry as YAML-shaped plain data, defaults included; valid against the schema."""
    out: dict[str, Any] = {}
    for f in yaml_fields(type(entry)):
        value = getattr(entry, f.name)
        if "kv" in f.metadata:
            out.update(_kv_to_dict(value))
        elif "section" in f.metadata:
            out[f.name] = None if value is None else section_to_dict(value)
        else:
            out[f.name] = _plain(value)
    return out


def entry_from_dict(name: str, data: Mapping[str, Any], cls: type) -> Any:
    """Build from YAML-shaped data (schema-valid); ValueError when the KV settings are invalid."""
    kwargs: dict[str, Any] = {"name": name}
    for f in yaml_fields(cls):
        if "kv" in f.metadata:
            kwargs["kv"] = _kv_from_dict(data)
        elif f.name in data and "section" in f.metadata:
            given = data[f.name]
            if given is None and f.metadata.get("optional"):
                continue
            kwargs[f.name] = section_from_dict(f.metadata["section"], given or {})
        elif f.name in data:
            kwargs[f.name] = _coerce(f, data[f.name])
    return cls(**kwargs)


def flat_keys(entry: Any, *, live: bool) -> dict[str, Any]:
    """`{key: value}` of the entry's keys that are (`live`) or are not live, sections and mappings
    flattened to dotted keys, KV settings under `overrides.` (JSON-serialisable)."""
    out: dict[str, Any] = {}
    for f in yaml_fields(type(entry)):
        if f.metadata.get("live", False) != live:
            continue
        value = getattr(entry, f.name)
        if "kv" in f.metadata:
            for name, setting in value.to_dict().items():
                out[name if name == "method" or name in OWN_KEYS else f"overrides.{name}"] = setting
        elif "section" in f.metadata:
            if value is None:
                out[f.name] = None
            else:
                out.update({f"{f.name}.{k}": v for k, v in section_to_dict(value).items()})
        elif isinstance(value, Mapping):
            out.update({f"{f.name}.{k}": value[k] for k in sorted(value)})
        else:
            out[f.name] = value
    return out


# The worker document's keys (veloxd.protocol.ENTRY_KEYS, `veloxd serve`'s flag dests) by the
# entry's flat key (`flat_keys`, the names `process_key` uses) each is read from; `kv` and
# `served_name` (the entry's name, under which the gateway forwards) are added by worker_settings.
# A restart key missing here reaches the worker another way (its environment, MLX's launcher).
WORKER_KEYS = {
    "model": "model",
    "host": "host",
    "port": "port",
    "adapter_path": "adapter_path",
    "max_tokens": "sampling.max_tokens",
    "temp": "sampling.temp",
    "top_p": "sampling.top_p",
    "prompt_cache_size": "prompt_cache.size",
    "prompt_cache_bytes": "prompt_cache.bytes",
    "limit_max_tokens": "limits.max_tokens",
    "limit_max_prompt_tokens": "limits.max_prompt_tokens",
    "request_body_timeout": "limits.request_body_timeout_s",
    "max_body_bytes": "limits.max_body_bytes",
    "api_key_env": "api_key_env",
    "distributed": "distributed.parallelism",  # absent (null) for a single worker
}


def worker_settings(entry: Any) -> dict[str, Any]:
    """What the entry's worker is told, by document key (veloxd.protocol.entry_document renders it)."""
    flat = flat_keys(entry, live=False)
    settings = {key: flat.get(path) for key, path in WORKER_KEYS.items()}
    return {**settings, "kv": entry.kv.to_dict(), "served_name": [entry.name]}


def section_from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """A section from schema-valid data: the keys given, coerced; the others keep their defaults."""
    return cls(**{f.name: _coerce(f, data[f.name]) for f in yaml_fields(cls) if f.name in data})


def _kv_to_dict(kv: KVCacheConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"method": kv.method}
    out.update({own: getattr(kv, own) for own in OWN_KEYS if own in fields_for(kv.method)})
    # Every setting of the method, defaults included (as the rest of the entry): what it runs with.
    out["overrides"] = {name: getattr(kv, name) for name in override_fields_for(kv.method)}
    return out


def _kv_from_dict(data: Mapping[str, Any]) -> KVCacheConfig:
    values: dict[str, Any] = {"method": data["method"]}
    values.update(data.get("overrides") or {})
    for own in OWN_KEYS:
        if data.get(own) is not None:
            values[own] = data[own]
    return KVCacheConfig.from_dict({name: whole_as_int(value) for name, value in values.items()})


def whole_as_int(value: Any) -> Any:
    """A number as the code takes it: JSON Schema's "integer" admits 32.0, KVCacheConfig and a port want 32."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def section_to_dict(value: Any) -> dict[str, Any]:
    """A section as YAML-shaped data, key by key."""
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Normalise a schema-valid value to the field's Python type (32.0 -> 32 for integers, 1 -> 1.0 for numbers)."""
    if f.metadata.get("convert"):
        return f.metadata["convert"](value)
    kind = f.metadata["schema"].get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}  # ["integer", "null"]: a nullable integer
    if value is None or isinstance(value, bool):
        return value
    if "integer" in kinds and isinstance(value, float) and value.is_integer():
        return int(value)
    if "number" in kinds and isinstance(value, int):
        return float(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _plain(value: Any) -> Any:
    """A key's value as YAML-shaped data: tuples as lists, mappings as dicts."""
    return list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
