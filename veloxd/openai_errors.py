"""OpenAI's error body, built by one rule for every layer that answers with one.

The worker's own refusals, mlx_lm's answers reshaped (veloxd/serve/mlx_compat/errors.py) and the
gateway's answers and stream error events all use `openai_error`: `{"error": {"message", "type",
"code", ...}}`, the type following the status (5xx: server_error, anything else:
invalid_request_error), so a client reads the same shape whichever layer refused it.
Stdlib only: the worker, the gateway and the daemon's command line may all import it.
"""

from __future__ import annotations

from typing import Any


def error_type(status: int) -> str:
    """OpenAI's `type` for an HTTP status: the server's fault (5xx) or the request's."""
    return "server_error" if status >= 500 else "invalid_request_error"


def openai_error(status: int, message: str, code: str | None = None, **extra: Any) -> dict[str, Any]:
    """The body of an error answer with `status`: message, type (from the status), code, then `extra`."""
    return {"error": {"message": message, "type": error_type(status), "code": code, **extra}}


def json_kind(value: Any) -> str:
    """The JSON Schema type name of a decoded JSON value (integer for 5, number for 5.5)."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: True is an int to Python, not to JSON
        return "boolean"
    if isinstance(value, int):
        return "integer"
    kinds = {float: "number", str: "string", list: "array", dict: "object"}
    return kinds.get(type(value), type(value).__name__)
