"""mlx_lm's own error answers in OpenAI's error shape.

mlx_lm's server answers a bad request with `{"error": "text"}` (a missing Content-Length, a
`max_tokens` of -5, a chat request without `messages`) and an unknown path with `Not Found`,
while every answer veloxd writes itself, and OpenAI's API, use `{"error": {"message", "type",
"code"}}`. A client that reads `error.message` should not have to know which layer refused it.
The handler marks the next body write once mlx_lm sets an error status; this writer reshapes it
(veloxd/openai_errors.py builds the body, as for every other error answer).
"""

from __future__ import annotations

import json
from typing import Any

from veloxd.openai_errors import error_type, openai_error


def reshape(data: bytes, status: int) -> bytes:
    """The body `data` of an error answer with status `status`, as an OpenAI error object
    (unchanged when it already is one)."""
    try:
        payload: Any = json.loads(data)
    except ValueError:
        payload = {"error": data.decode("utf-8", "replace").strip() or f"HTTP {status}"}
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return data
    message = error if isinstance(error, str) else json.dumps(payload)
    return json.dumps(openai_error(status, message, code=error_type(status))).encode()  # mlx_lm gives no code


class ShapedWriter:
    """The handler's wfile: the first write after `expect(status)` is reshaped by `reshape`."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._status: int | None = None

    def expect(self, status: int) -> None:
        self._status = status

    def write(self, data: bytes) -> int:
        status, self._status = self._status, None
        if status is not None:
            data = reshape(data, status)
        return self.raw.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)  # flush, closed, ...: the socket writer's own
