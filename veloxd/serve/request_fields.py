"""Request fields mlx_lm's server reads without checking, checked before it reads them.

mlx_lm validates the sampling numbers (`validate_model_parameters`) but takes `stop`,
`messages`, `prompt`, `tools`, `role_mapping`, `chat_template_kwargs` and `stream_options` as
they come. A wrong type there fails later, in the worst place: `"stop": 5` (or `[5]`) raises in
the generation thread's batched path outside any handler, and the thread dies, so one request
takes the whole server down; the others fail inside `generate()`, which mlx_lm answers with a
404. Every answer here is a 400 naming the field (`param`, as OpenAI's errors do).

Also refused: a JSON boolean where mlx_lm wants a number (Python's `True` is an int, so
`"max_tokens": true` would pass its check as 1) and `n` above 1 (mlx_lm generates one choice
and would say nothing about the others).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from veloxd.openai_errors import json_kind

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
TEXT_PATHS = ("/v1/completions",)
MAX_STOP_SEQUENCES = 16  # each one is matched after every token; OpenAI takes 4

# Fields mlx_lm checks as numbers with isinstance(value, int | float), which True and False pass.
NUMERIC_FIELDS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "num_draft_tokens",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "presence_context_size",
    "frequency_penalty",
    "frequency_context_size",
    "top_logprobs",
    "xtc_probability",
    "xtc_threshold",
    "seed",
)
OBJECT_FIELDS = ("chat_template_kwargs", "stream_options", "role_mapping")


@dataclass(frozen=True)
class FieldProblem:
    param: str
    message: str


def problem(path: str, body: dict[str, Any]) -> FieldProblem | None:
    """The first field of `body` (a request to `path`) that mlx_lm would fail on, or None."""
    checks = [_numbers(body), _seed(body.get("seed")), _stop(body.get("stop")), _objects(body), _n(body.get("n"))]
    if path in CHAT_PATHS:
        checks = [_messages(body.get("messages")), _tools(body.get("tools")), *checks]
    elif path in TEXT_PATHS:
        checks = [_prompt(body), *checks]
    return next((found for found in checks if found is not None), None)


def _messages(messages: Any) -> FieldProblem | None:
    if messages is None:
        return FieldProblem("messages", "messages is required: a list of {role, content} objects")
    if not isinstance(messages, list) or not messages:
        return FieldProblem("messages", f"messages must be a non-empty list of objects, got {_shown(messages)}")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            return FieldProblem(where, f"{where} must be an object with a role, got {json_kind(message)}")
        if not isinstance(message.get("role"), str):
            return FieldProblem(f"{where}.role", f"{where}.role must be a string, got {json_kind(message.get('role'))}")
        content = message.get("content")
        if content is None and message["role"] != "assistant":  # only an assistant turn may be all tool calls
            return FieldProblem(f"{where}.content", f"{where}.content is required for role {message['role']}")
        if content is not None and not isinstance(content, (str, list)):
            return FieldProblem(
                f"{where}.content",
                f"{where}.content must be a string, a list of content parts or null, got {json_kind(content)}",
            )
        if isinstance(content, list) and not all(isinstance(part, dict) for part in content):
            return FieldProblem(f"{where}.content", f"{where}.content parts must be objects")
    return None


def _prompt(body: dict[str, Any]) -> FieldProblem | None:
    prompt = body.get("prompt")
    if prompt == "":  # no tokens to start from: mlx_lm's batch generator raises in its thread, which dies
        return FieldProblem("prompt", "prompt must not be empty")
    if isinstance(prompt, str):
        return None
    if prompt is None:
        return FieldProblem("prompt", "prompt is required: a string")
    return FieldProblem("prompt", f"prompt must be a string (one prompt per request), got {json_kind(prompt)}")


def _tools(tools: Any) -> FieldProblem | None:
    if tools is None or (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        return None
    return FieldProblem("tools", f"tools must be a list of tool objects, got {_shown(tools)}")


def _seed(seed: Any) -> FieldProblem | None:
    # mx.random.seed takes an unsigned 64-bit integer; anything else raises after the prefill
    if seed is None or isinstance(seed, bool) or not isinstance(seed, int) or 0 <= seed < 2**64:
        return None  # a wrong type is mlx_lm's own check (400); a boolean is _numbers'
    return FieldProblem("seed", f"seed must be between 0 and 2^64 - 1, got {seed}")


def _stop(stop: Any) -> FieldProblem | None:
    if stop == "":
        return FieldProblem("stop", "stop must be a non-empty string (or left out)")
    if stop is None or isinstance(stop, str):
        return None
    if not isinstance(stop, list):
        return FieldProblem("stop", f"stop must be a string or a list of strings, got {json_kind(stop)}")
    if len(stop) > MAX_STOP_SEQUENCES:
        return FieldProblem("stop", f"stop holds {len(stop)} sequences; at most {MAX_STOP_SEQUENCES} are taken")
    for index, word in enumerate(stop):
        if not isinstance(word, str) or not word:
            got = "an empty string" if word == "" else json_kind(word)
            return FieldProblem("stop", f"stop[{index}] must be a non-empty string, got {got}")
    return None


def _numbers(body: dict[str, Any]) -> FieldProblem | None:
    for name in NUMERIC_FIELDS:
        if isinstance(body.get(name), bool):
            return FieldProblem(name, f"{name} must be a number, got boolean")
    return None


def _objects(body: dict[str, Any]) -> FieldProblem | None:
    for name in OBJECT_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            return FieldProblem(name, f"{name} must be an object, got {json_kind(value)}")
    return None


def _n(n: Any) -> FieldProblem | None:
    if n is None or (n == 1 and not isinstance(n, bool)):
        return None
    return FieldProblem("n", f"n must be 1: this server generates one choice per request, got {json.dumps(n)}")


def _shown(value: Any) -> str:
    return "an empty list" if value == [] else json_kind(value)
