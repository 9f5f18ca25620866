"""The exact dict round trip of the whole typed config (the daemon's state file stores it as JSON);
entries and sections go through veloxd.config.codec."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from veloxd.config.codec import entry_from_dict, section_from_dict
from veloxd.config.model import Config, ServerEntry
from veloxd.config.sections import Dashboard


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain data for the state file; `config_from_dict` inverts it exactly."""
    out = {
        "version": config.version,
        "source": config.source,
        "sha256": config.sha256,
        "servers": {name: entry.to_dict() for name, entry in config.servers.items()},
        **({"gateway": config.gateway.to_dict()} if config.gateway is not None else {}),
    }
    if config.dashboard is not None:  # absent means none: an explicit null would not validate
        out["dashboard"] = dataclasses.asdict(config.dashboard)
    return out


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Inverse of `config_to_dict` (no file-system checks); ValueError when `data` is malformed."""
    from veloxd.config.gateway import Gateway

    try:
        servers = {name: entry_from_dict(name, entry, ServerEntry) for name, entry in data["servers"].items()}
        gateway = Gateway.from_dict(data["gateway"]) if data.get("gateway") is not None else None
        return Config(
            version=int(data["version"]),
            servers=servers,
            source=str(data["source"]),
            sha256=str(data["sha256"]),
            dashboard=dashboard_from_dict(data.get("dashboard")),
            gateway=gateway,
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"malformed config data: {type(err).__name__}: {err}") from None


def dashboard_from_dict(data: Mapping[str, Any] | None) -> Dashboard | None:
    """The `dashboard:` block from schema-valid data; None when absent."""
    return None if data is None else section_from_dict(Dashboard, data)
