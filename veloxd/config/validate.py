"""JSON Schema validation of parsed YAML, each error turned into one located, one-line `ConfigIssue`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, cast

from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError

from veloxd.checks import SIZE_HELP, SIZE_PATTERN, did_you_mean
from veloxd.config.errors import ConfigIssue, json_path, one_line, short_repr
from veloxd.config.model import VERSION
from veloxd.config.schema import default_schema
from veloxd.config.yaml_nodes import Span
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, override_fields_for, owners, settings
from veloxd.kv.refusals import not_applicable

YAML11_BOOLEANS = ("yes", "no", "on", "off", "y", "n")
_EXPECTED = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "empty",
}
Explained = tuple[tuple, str, str]  # (path, message, anchor: "key" | "value" | "container")


def schema_issues(
    data: Any, spans: dict[tuple, Span], file: str, schema: dict[str, Any] | None = None
) -> list[tuple[tuple, ConfigIssue]]:
    """Every schema violation in `data` as (path parts, issue), one per (path, message)."""
    validator = Draft7Validator(schema or default_schema())
    explained = [
        (_rank(err), path, message, anchor)
        for err in validator.iter_errors(data)
        for path, message, anchor in _explain(err, data)
    ]
    # One kind of complaint per place: an unknown key hides the checks of its value, a wrong type hides
    # the range checks, and nothing is reported below a key that is itself wrong.
    best: dict[tuple, int] = {}
    for rank, path, _, _ in explained:
        best[path] = min(best.get(path, rank), rank)
    found: dict[tuple[str, str], tuple[tuple, ConfigIssue]] = {}
    for rank, path, message, anchor in explained:
        if rank > best[path] or any(best.get(path[:i], 9) <= 1 for i in range(len(path))):
            continue
        issue = locate(file, spans, path, message, anchor)
        found.setdefault((issue.path, issue.message), (path, issue))
    return list(found.values())


def _rank(err: ValidationError) -> int:
    """0 unknown key, 1 key not allowed for the method, 2 wrong type, 3 anything else (bad names too)."""
    if err.validator == "additionalProperties":
        return 0
    if "propertyNames" in err.relative_schema_path:
        return 3
    return {"not": 1, "type": 2}.get(str(err.validator), 3)


def locate(file: str, spans: dict[tuple, Span], path: tuple, message: str, anchor: str = "value") -> ConfigIssue:
    """An issue at `path`: its key, its value, or (for a missing key) the mapping that lacks it."""
    probe = path[:-1] if anchor == "container" else path
    while probe not in spans and probe:
        probe = probe[:-1]
    span = spans.get(probe)
    if span is None:
        line, column = 1, 1
    elif (anchor in ("key", "container") or span.collection) and span.key is not None:
        line, column = span.key
    else:
        line, column = span.value
    return ConfigIssue(file, line, column, json_path(path), one_line(message))


def _explain(err: ValidationError, data: Any) -> Iterator[Explained]:
    path = tuple(err.absolute_path)
    # A validator sets these on every error it yields; the stubs also allow jsonschema's "unset" marker.
    value, rule = cast(Any, err.instance), cast(Any, err.validator_value)
    if "propertyNames" in err.relative_schema_path:
        yield path + (value,), _bad_name(path, value, err), "key"
    elif err.validator == "additionalProperties":
        schema = err.schema if isinstance(err.schema, Mapping) else {}
        allowed = list(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        for name in value:
            if name not in allowed and not any(re.search(p, name) for p in patterns):
                yield path + (name,), _unknown_key(path, name, allowed, data), "key"
    elif err.validator == "required":
        for name in rule:
            if isinstance(value, dict) and name not in value:
                yield path + (name,), _missing(path, name), "container"
    else:
        yield path, _value_message(err, path, value, data), "value"


def method_of(data: Any, path: tuple) -> str | None:
    """The (valid) method of the server entry that `path` is inside, if any."""
    if len(path) < 2 or path[0] != "servers" or not isinstance(data, dict):
        return None
    servers = data.get("servers")
    entry = servers.get(path[1]) if isinstance(servers, dict) else None
    method = entry.get("method") if isinstance(entry, dict) else None
    return method if isinstance(method, str) and method in registry.names() else None


def _label(path: tuple) -> str:
    rel = path[2:] if path[:1] == ("servers",) and len(path) > 2 else path
    if rel[:1] == ("overrides",) and len(rel) == 2:
        return str(rel[1])
    return ".".join(str(p) for p in rel) or "the top level"


def _bad_name(path: tuple, name: Any, err: ValidationError) -> str:
    if path[-1:] == ("env",):
        return f"'{name}' is not an environment variable name (letters, digits and '_', not starting with a digit)"
    if err.validator == "maxLength":
        return f"server name '{name}' is longer than {err.validator_value} characters"
    return f"server name '{name}' is not valid: use lowercase letters, digits, '-' and '_', starting with a letter or digit"


def _unknown_key(path: tuple, name: str, allowed: list[str], data: Any) -> str:
    kv_fields = [f.name for f in settings()]
    if path == ():
        return f"unknown top-level key '{name}'{did_you_mean(name, allowed)} (valid: {', '.join(allowed)}, x-*)"
    if len(path) == 2 and path[0] == "servers":
        if name in kv_fields and name not in OWN_KEYS:
            return f"{name} is a KV-cache setting: put it under overrides"
        return f"unknown key '{name}' in server '{path[1]}'{did_you_mean(name, allowed)}"
    method = method_of(data, path)
    if len(path) == 3 and path[2] == "overrides":
        if name in OWN_KEYS:
            return f"{name} is a key of the server entry, not an override"
        if name in kv_fields and method and method not in owners(name):
            return not_applicable(name, method, owners(name))
        valid = list(override_fields_for(method)) if method else [n for n in kv_fields if n not in OWN_KEYS]
        hint = did_you_mean(name, valid)
        if not hint:
            hint = f" (method {method} has no overrides)" if not valid else f" (valid: {', '.join(valid)})"
        return f"unknown override '{name}'" + (f" for method {method}" if method else "") + hint
    where = _label(path)
    return f"unknown key '{name}' in {where}" + (did_you_mean(name, allowed) or f" (valid: {', '.join(allowed)})")


def _missing(path: tuple, name: str) -> str:
    if path == ():
        return f"missing required key '{name}'" + (f" (write 'version: {VERSION}')" if name == "version" else "")
    if len(path) == 2 and path[0] == "servers":
        hint = " (or add a gateway: block: servers behind it get a port assigned)" if name == "port" else ""
        return f"server '{path[1]}' is missing required key '{name}'{hint}"
    return f"{_label(path)} is missing required key '{name}'"


def _value_message(err: ValidationError, path: tuple, value: Any, data: Any) -> str:
    label, method, kind = _label(path), method_of(data, path), err.validator
    rule = cast(Any, err.validator_value)  # set by the validator, as in _explain
    for_method = f" for method {method}" if method and path[2:3] == ("overrides",) else ""
    key = path[-1] if path else None
    if kind == "not" and key in OWN_KEYS and method:
        return not_applicable(key, method, owners(key), value)
    if kind == "enum" and key == "method" and len(path) == 3:
        return registry.unknown_method(str(value))
    if kind == "enum" and key == "bits" and len(path) == 3:
        if method and registry.get(method).bits_choices:
            return f"bits={short_repr(value)} is not valid for method {method}; choose one of {list(registry.get(method).bits_choices)}"
        choices = [c for c in rule if c is not None]
        return f"bits={short_repr(value)} is not valid; choose one of {choices}"
    if kind == "enum":
        return f"{label}={short_repr(value)}{for_method}: choose one of {[c for c in rule if c is not None]}"
    if kind == "const" and path == ("version",):
        shown = (
            short_repr(value)
            if isinstance(value, (int, float, str)) and not isinstance(value, bool)
            else _describe(value)
        )
        return f"unsupported version {shown}; this veloxd reads version {VERSION}"
    if kind == "type":
        return _type_message(label, path, value, rule)
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if kind in bounds:
        return f"{label}={short_repr(value)}{for_method}: must be {bounds[kind]} {rule}"
    if kind == "pattern":
        if err.validator_value == SIZE_PATTERN:
            return f"{label}={short_repr(value)} is not a size; use {SIZE_HELP}"
        if key == "api_key_env":
            return f"api_key_env={short_repr(value)} is not an environment variable name (letters, digits and '_')"
        if key == "host":
            return f"host={short_repr(value)} is not a host name or IP address"
        return f"{label}={short_repr(value)} does not match {rule}"
    if kind == "minLength":
        return f"{label} must not be empty"
    if kind == "maxLength":
        return f"{label} is longer than {rule} characters"
    return f"{label}: {err.message}"


def _type_message(label: str, path: tuple, value: Any, expected: str | list[str]) -> str:
    wanted = [expected] if isinstance(expected, str) else list(expected)
    text = " or ".join(_EXPECTED.get(w, w) for w in wanted if w != "null")
    if len(path) == 2 and path[0] == "servers":
        label = f"server '{path[1]}'"
    message = f"{label} must be {text}, not {_describe(value)}"
    if "boolean" in wanted and isinstance(value, str) and value.lower() in YAML11_BOOLEANS:
        message += " (veloxd reads YAML 1.2, where only true and false are booleans)"
    elif wanted == ["string"] and isinstance(value, (bool, int, float)):
        message += f' (quote it: "{str(value).lower() if isinstance(value, bool) else value}")'
    return message


def _describe(value: Any) -> str:
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {short_repr(value)}"
    return "a list" if isinstance(value, list) else "a mapping"
