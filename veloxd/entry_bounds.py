"""Defaults, bounds and choices of the entry keys `veloxd serve` also takes as flags, stated once.

veloxd/config/sections.py declares those keys with the schemas and defaults below (so the generated
schema, `veloxd check` and docs/reference.md carry them), and the worker checks its flags and fills
its defaults from the same objects (veloxd/serve/options.py, veloxd/serve/limits.py): one edit
changes both. Stdlib only and outside the config package: the worker validates its flags before
anything heavy is imported, the config package's YAML and JSON Schema libraries included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# where it listens (the dashboard and the gateway take the same range):
PORT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 65535}
# sampling:
TEMP: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 2}
TOP_P: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
MAX_TOKENS: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 1 << 20}
# prompt_cache:
PROMPT_CACHE_SIZE: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 100000}
# limits: max_tokens and max_prompt_tokens (null: the model's context length), the body's time and size
REQUEST_TOKENS: dict[str, Any] = {"type": ["integer", "null"], "minimum": 1, "maximum": 1 << 24}
REQUEST_BODY_TIMEOUT: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}  # seconds
REQUEST_BODY_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 32 * 2**20
# distributed:
PARALLELISM: dict[str, Any] = {"type": "string", "enum": ["tensor", "pipeline"]}


def out_of_bounds(value: Any, schema: Mapping[str, Any]) -> str | None:
    """How `value` breaks `schema`'s enum, minimum, exclusiveMinimum or maximum, in the worker's
    words ("must be between 0 and 2"); None when it keeps them."""
    if "enum" in schema:
        choices = [c for c in schema["enum"] if c is not None]
        return None if value in choices else f"choose one of {', '.join(map(str, choices))}"
    low, high = schema.get("minimum"), schema.get("maximum")
    above = schema.get("exclusiveMinimum")
    if (low is None or value >= low) and (above is None or value > above) and (high is None or value <= high):
        return None
    if above is not None:
        return f"must be > {above}" + ("" if high is None else f" and <= {high}")
    return f"must be >= {low}" if high is None else f"must be between {low} and {high}"
