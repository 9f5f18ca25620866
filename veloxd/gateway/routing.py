"""The model names a client may send, and the entry each one reaches. Stdlib only."""

from __future__ import annotations

import os
from typing import Any


def model_ids(model: str) -> list[str]:
    """The names an entry's `model` may be asked by: the HF id, or a local path and its directory name."""
    return [model, os.path.basename(model.rstrip("/"))] if model.startswith("/") else [model]


def serving(servers: dict[str, Any], model_id: str) -> list[str]:
    """The entries whose model `model_id` names, in config order."""
    return [name for name, server in servers.items() if model_id in model_ids(server["model"])]


def routing_table(servers: dict[str, Any]) -> dict[str, str]:
    """Model names clients may send: entry names, then aliases, then HF ids / model paths used by one entry only."""
    routes = {name: name for name in servers}
    for name, server in servers.items():
        for alias in server.get("aliases") or ():
            routes.setdefault(alias, name)
    by_model: dict[str, list[str]] = {}
    for name, server in servers.items():
        for model_id in model_ids(server["model"]):
            by_model.setdefault(model_id, []).append(name)
    for model, names in by_model.items():
        if len(names) == 1:
            routes.setdefault(model, names[0])
    return routes
