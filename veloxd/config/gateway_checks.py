"""Semantic checks of the `gateway:` block and of what routing through it needs (names, ports, start modes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from veloxd.checks import parse_size
from veloxd.config.gateway import Gateway, assign_port
from veloxd.config.model import ServerEntry
from veloxd.config.semantic import Problems, _check_host


def check_gateway(raw: Any, bad_keys: set[str]) -> tuple[Gateway | None, Problems]:
    """The Gateway built from the YAML mapping, or None and why not (schema problems are reported elsewhere)."""
    problems: Problems = []

    def report(path: tuple, message: str) -> None:
        problems.append((("gateway", *path), message.replace("exposes the server", "exposes the gateway")))

    if not isinstance(raw, dict):
        return None, problems
    if not bad_keys & {"host", "api_key_env", "allow_unauthenticated"}:
        _check_host(raw, report)
    for size_key in ("memory_budget", "max_body_bytes"):
        if raw.get(size_key) is not None and size_key not in bad_keys:
            try:
                parse_size(raw[size_key])
            except ValueError as err:
                report((size_key,), f"gateway.{size_key}: {err}")
    if problems or bad_keys or "port" not in raw:
        return None, problems
    return Gateway.from_dict(raw), problems


def check_routing(raw_servers: Mapping[str, Any], has_gateway: bool) -> Problems:
    """on_demand entries have a gateway; no model name (entry name or alias) means two servers.

    (A missing port without a gateway is the schema's: editors flag it too.)
    """
    problems: Problems = []
    owner = {name: name for name in raw_servers}
    for name, raw in raw_servers.items():
        if not isinstance(raw, dict):
            continue
        if not has_gateway and raw.get("start") == "on_demand":
            problems.append(
                (
                    ("servers", name, "start"),
                    "start: on_demand needs a gateway: block (the gateway starts the server on its first request)",
                )
            )
        aliases = raw.get("aliases")
        for index, alias in enumerate(aliases if isinstance(aliases, list) else []):
            if not isinstance(alias, str):
                continue
            other = owner.setdefault(alias, name)
            if other != name:
                what = f"the name of server '{other}'" if alias in raw_servers else f"an alias of server '{other}'"
                problems.append((("servers", name, "aliases", index), f"alias '{alias}' is already {what}"))
    return problems


def with_assigned_ports(servers: dict[str, ServerEntry], gateway: Gateway | None) -> dict[str, ServerEntry]:
    """Entries without a port get one from the assigned range (in name order: independent of file order)."""
    taken = {e.port for e in servers.values() if e.port is not None} | ({gateway.port} if gateway else set())
    out = dict(servers)
    for name in sorted(n for n, e in servers.items() if e.port is None):
        port = assign_port(name, taken)
        taken.add(port)
        out[name] = dataclasses.replace(servers[name], port=port)
    return out
