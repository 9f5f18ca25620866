"""Semantic checks of the `gateway:` block and of what routing through it needs (names, ports, start modes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from veloxd.config.gateway import Gateway, assign_port
from veloxd.config.model import ServerEntry
from veloxd.config.semantic import Problems, _check_host, check_sizes
from veloxd.kv.config_rules import ENABLED_BY


def check_gateway(raw: Any, bad_keys: set[str]) -> tuple[Gateway | None, Problems]:
    """The Gateway built from the YAML mapping, or None and why not (schema problems are reported elsewhere)."""
    problems: Problems = []

    def report(path: tuple, message: str) -> None:
        problems.append((("gateway", *path), message.replace("exposes the server", "exposes the gateway")))

    if not isinstance(raw, dict):
        return None, problems
    if not bad_keys & {"host", "api_key_env", "allow_unauthenticated"}:
        _check_host(raw, report)
    check_sizes(raw, Gateway, bad_keys, report, label="gateway.")
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
        if not has_gateway and "port" in raw and raw["port"] is None:
            problems.append(
                (
                    ("servers", name, "port"),
                    "port: null needs a gateway: block (servers behind it get a port assigned); give a port",
                )
            )
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


def ineffective_keys(raw_servers: Mapping[str, Any], has_gateway: bool, refused: set[tuple]) -> Problems:
    """Server keys that are valid but do nothing where they are written: warnings, not errors (the
    file works; it just does not do what the key says). Keys the schema refused are left out."""
    problems: Problems = []
    for name, raw in raw_servers.items():
        if not isinstance(raw, dict):
            continue
        where = ("servers", name)
        # Only the gateway's idle task unloads, and it looks at on_demand servers alone.
        if raw.get("idle_unload_s") is not None and raw.get("start") != "on_demand":
            problems.append(
                (
                    (*where, "idle_unload_s"),
                    "idle_unload_s does nothing on a server with start: always "
                    "(the gateway unloads only start: on_demand servers when idle)",
                )
            )
        overrides = raw.get("overrides")
        for setting, switch in ENABLED_BY.items():
            if isinstance(overrides, dict) and setting in overrides and overrides.get(switch) is not True:
                problems.append(
                    (
                        (*where, "overrides", setting),
                        f"{setting} does nothing unless {switch}: true (set it in overrides too, or remove {setting})",
                    )
                )
        # A worker answers to its entry name only; the aliases live in the gateway's routing table.
        if raw.get("aliases") and not has_gateway:
            problems.append(
                (
                    (*where, "aliases"),
                    "aliases do nothing without a gateway: block (only the gateway routes requests by model name)",
                )
            )
    return [(path, message) for path, message in problems if path not in refused and path[:2] not in refused]


def with_assigned_ports(servers: dict[str, ServerEntry], gateway: Gateway | None) -> dict[str, ServerEntry]:
    """Entries without a port get one from the assigned range (in name order: independent of file order)."""
    taken = {e.port for e in servers.values() if e.port is not None} | ({gateway.port} if gateway else set())
    out = dict(servers)
    for name in sorted(n for n, e in servers.items() if e.port is None):
        port = assign_port(name, taken)
        taken.add(port)
        out[name] = dataclasses.replace(servers[name], port=port)
    return out


def check_dashboard_beside_gateway(raw_gateway: Any, raw_dashboard: Any) -> Problems:
    """A `dashboard:` block next to a `gateway:` block would be a second dashboard: refused, saying where it is.

    The gateway serves the dashboard and /metrics on its own port (veloxd.gateway.dashboard), with
    its counters of admissions, unloads and queued requests; a sidecar on another port would show
    the same servers without them, so the file names one place only.
    """
    if not isinstance(raw_gateway, dict) or raw_dashboard is None:
        return []
    port = raw_gateway.get("port")
    where = f"http://127.0.0.1:{port}/ and /metrics" if isinstance(port, int) else "the gateway's port"
    return [
        (
            ("dashboard",),
            "with a gateway: block the gateway serves the dashboard and /metrics itself "
            f"({where}; actions use gateway.api_key_env): remove the dashboard: block",
        )
    ]
