"""The `model` a request names: read from its body, resolved to an entry, or the OpenAI-shaped
error saying why it cannot be (no body object, no string, unknown, or served by several entries)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from veloxd.gateway.fleet import Fleet
from veloxd.gateway.proxy import error_response
from veloxd.gateway.routing import serving
from veloxd.openai_errors import json_kind

SHOWN_CHARS = 60  # a huge value must not become a huge message


def requested_model(fleet: Fleet, payload: Any) -> str | web.Response:
    """The body's `model` string, or the 400 naming what is wrong with the body or the field."""
    if not isinstance(payload, dict):
        return error_response(
            400, f"the request body must be a JSON object (got a JSON {json_kind(payload)})", "invalid_body"
        )
    if "model" not in payload:
        return error_response(
            400,
            f"request has no 'model'; valid models: {', '.join(fleet.servers)}",
            "model_required",
            valid=list(fleet.servers),
        )
    model = payload["model"]
    if not isinstance(model, str):
        return error_response(400, f"'model' must be a string (got {_shown(model)})", "invalid_model", param="model")
    return model


def resolve(fleet: Fleet, model: str) -> str | web.Response:
    """The entry `model` reaches, or the 404 saying it is unknown or which entries share it."""
    name = fleet.resolve(model)
    if name is not None:
        return name
    shared = serving(fleet.servers, model)
    if len(shared) > 1:  # one entry serving it would have been routed (veloxd.gateway.routing)
        return error_response(
            404,
            f"model {model!r} is served by several entries: {', '.join(shared)}; name one of them",
            "model_ambiguous",
            param="model",
            served_by=shared,
            valid=list(fleet.servers),
        )
    return unknown_model(fleet, model)


def unknown_model(fleet: Fleet, model: str) -> web.Response:
    names = list(fleet.servers)
    aliases = sorted(a for server in fleet.servers.values() for a in server.get("aliases") or ())
    also = f" (aliases: {', '.join(aliases)})" if aliases else ""
    return error_response(
        404,
        f"model {model!r} not found; valid models: {', '.join(names) or 'none'}{also}",
        "model_not_found",
        valid=names,
        aliases=aliases,
    )


def _shown(value: Any) -> str:
    """The value as the client wrote it (JSON: null, true), cut short."""
    text = json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
