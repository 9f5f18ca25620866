"""`load_config(path)`: file checks, YAML with positions, schema, semantic checks; every problem at once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from veloxd.config.codec import whole_as_int
from veloxd.config.errors import ConfigError, ConfigIssue, json_path, one_line, short_repr
from veloxd.config.gateway import GATEWAY_NAME
from veloxd.config.gateway_checks import (
    check_dashboard_beside_gateway,
    check_gateway,
    check_routing,
    ineffective_keys,
    with_assigned_ports,
)
from veloxd.config.model import VERSION, Config, ServerEntry
from veloxd.config.roundtrip import dashboard_from_dict
from veloxd.config.semantic import check_dashboard, check_entry, endpoint_conflicts
from veloxd.config.source import SourceProblem, read_source
from veloxd.config.validate import locate, schema_issues
from veloxd.config.world import entry_conditions
from veloxd.config.yaml_nodes import YamlProblem, parse


@dataclass
class Inspection:
    """What `veloxd check` reports: the config when valid, else every issue sorted by position."""

    config: Config | None
    issues: list[ConfigIssue] = field(default_factory=list)
    unreadable: bool = False
    # Conditions of the world (a model path that does not exist yet...): the file is valid, and
    # the daemon makes only the entry concerned wait (veloxd.config.world).
    warnings: list[ConfigIssue] = field(default_factory=list)
    # Valid keys that do nothing where they are written (idle_unload_s on a start: always server...):
    # warnings too, but no server waits for them to change, so they are kept apart.
    ineffective: list[ConfigIssue] = field(default_factory=list)
    spans: dict[tuple, Any] = field(default_factory=dict)  # YAML positions, to locate later findings too
    servers: Mapping[str, ServerEntry] = field(default_factory=dict)  # the entries that parsed, even in an invalid file


def load_config(path: str | os.PathLike) -> Config:
    """The validated config in `path`; ConfigError listing every problem otherwise."""
    result = inspect_config(path)
    if result.config is None:
        raise ConfigError(result.issues, unreadable=result.unreadable)
    return result.config


def inspect_config(path: str | os.PathLike) -> Inspection:
    """Like load_config, but returns the issues instead of raising.

    Long: the loader's stages in the order a file meets them (read, parse, schema, semantics, the
    world), each adding located issues; one reading, top to bottom.
    """
    file = os.fspath(path)
    try:
        source = read_source(path)
    except SourceProblem as problem:
        issue = ConfigIssue(file, *problem.position, "$", one_line(problem.message))
        return Inspection(None, [issue], unreadable=problem.unreadable)
    issues = [ConfigIssue(file, *position, "$", one_line(message)) for position, message in source.problems]
    try:
        parsed = parse(source.text)
    except YamlProblem as problem:
        return _invalid(
            issues + [ConfigIssue(file, *problem.position, json_path(problem.path), one_line(problem.message))]
        )
    yaml_issues = [
        ConfigIssue(file, *position, json_path(p), one_line(message)) for position, p, message in parsed.problems
    ]
    issues += yaml_issues
    data, spans = parsed.data, parsed.spans
    if data is None:
        blank = all(not line.strip() or line.lstrip().startswith("#") for line in source.text.splitlines())
        what = "the file is empty" if blank else "the file holds only null"
        return _invalid(
            issues + [ConfigIssue(file, 1, 1, "$", f"{what}: write 'version: {VERSION}' and a 'servers' mapping")]
        )
    if not isinstance(data, dict):
        return _invalid(
            issues
            + [
                locate(
                    file, spans, (), f"the top level must be a mapping with 'version' and 'servers', not {_kind(data)}"
                )
            ]
        )
    bad_paths = {p for _, p, _ in parsed.problems}
    for path_parts, issue in schema_issues(data, spans, file):
        if path_parts not in bad_paths:  # e.g. a bad tag: do not also report the string's type
            issues.append(issue)
            bad_paths.add(path_parts)
    servers: dict[str, ServerEntry] = {}
    found = data.get("servers")
    raw_servers: dict[str, Any] = found if isinstance(found, dict) else {}
    for name, raw in raw_servers.items():
        if not isinstance(raw, dict):
            continue
        refused = {p[2:] for p in bad_paths if len(p) > 2 and p[:2] == ("servers", name)}
        entry, problems = check_entry(name, raw, source.path.parent, refused)
        issues += [locate(file, spans, ("servers", name) + p, message) for p, message in problems]
        if entry is not None:
            servers[name] = entry
    gateway, gateway_problems = check_gateway(
        data.get("gateway"), {p[1] for p in bad_paths if p[:1] == ("gateway",) and len(p) > 1}
    )
    has_gateway = gateway is not None or "gateway" in data
    gateway_problems += check_routing(raw_servers, has_gateway)
    issues += [locate(file, spans, p, message) for p, message in gateway_problems]
    ineffective = [
        locate(file, spans, p, message, "key") for p, message in ineffective_keys(raw_servers, has_gateway, bad_paths)
    ]
    endpoints = _endpoints(raw_servers)
    if isinstance(data.get("gateway"), dict):
        endpoints.update(_endpoints({GATEWAY_NAME: data["gateway"]}))
    for name, message in endpoint_conflicts(endpoints):
        where = ("gateway", "port") if name == GATEWAY_NAME else ("servers", name, "port")
        issues.append(locate(file, spans, where, message))
    from veloxd.distributed.checks import port_conflicts  # here: it imports veloxd.config.sections

    for name, message in port_conflicts(raw_servers):
        issues.append(locate(file, spans, ("servers", name, "distributed", "port"), message))
    dashboard = None
    raw_dashboard = data.get("dashboard")
    issues += [locate(file, spans, p, m) for p, m in check_dashboard_beside_gateway(data.get("gateway"), raw_dashboard)]
    if isinstance(raw_dashboard, dict) and not any(p[:1] == ("dashboard",) for p in bad_paths):
        problems = check_dashboard(raw_dashboard, _endpoints(raw_servers))
        issues += [locate(file, spans, ("dashboard", *p), message) for p, message in problems]
        dashboard = dashboard_from_dict(raw_dashboard)
    # Computed for the entries that did parse even when others are wrong: `check` shows every mistake at once.
    warnings = [
        locate(file, spans, ("servers", name) + condition.path, condition.message)
        for name, entry in servers.items()
        for condition in entry_conditions(entry, ports=False)
    ]
    if issues:
        return Inspection(
            None,
            _sorted(issues),
            warnings=_sorted(warnings),
            ineffective=_sorted(ineffective),
            spans=spans,
            servers=servers,
        )
    config = Config(
        version=VERSION,
        servers=with_assigned_ports(servers, gateway),
        source=str(source.path),
        sha256=source.sha256,
        dashboard=dashboard,
        gateway=gateway,
    )
    return Inspection(
        config, warnings=_sorted(warnings), ineffective=_sorted(ineffective), spans=spans, servers=config.servers
    )


def _invalid(issues: list[ConfigIssue]) -> Inspection:
    return Inspection(None, _sorted(issues))


def _sorted(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    return sorted(set(issues), key=lambda i: (i.line, i.column, i.path, i.message))


def _endpoints(raw_servers: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """host:port of every entry whose host and port are themselves valid."""
    out = {}
    for name, raw in raw_servers.items():
        if not isinstance(raw, dict):
            continue
        host, port = raw.get("host", ServerEntry.host), whole_as_int(raw.get("port"))  # 8080.0 is port 8080
        if isinstance(host, str) and isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            out[name] = (host, port)
    return out


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {short_repr(value)}"
    return f"the value {short_repr(value)}"
