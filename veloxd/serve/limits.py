"""Bounds on the work one request may cause, and the model facts that resolve their defaults.

`limits.max_tokens` and `limits.max_prompt_tokens` default to the model's context length, which
only the loaded model knows: the worker resolves them after loading and reports the effective
values in its READY line. The config's rule is veloxd.model_config's (the daemon bills memory by
it too); the tokenizer's limit only when the config states none. No mlx import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from veloxd import entry_bounds
from veloxd.model_config import as_config, stated_context_length

UNBOUNDED_TOKENIZER_LENGTH = 10**9  # transformers' "no limit" sentinel is ~1e30


@dataclass(frozen=True)
class RequestLimits:
    """What `veloxd serve` was asked to enforce; None: the model's context length."""

    max_tokens: int | None = None
    max_prompt_tokens: int | None = None
    body_timeout_s: float = entry_bounds.REQUEST_BODY_TIMEOUT_S  # the config's limits.* defaults
    max_body_bytes: int = entry_bounds.MAX_BODY_BYTES

    def resolve(self, context_length: int | None) -> EffectiveLimits:
        return EffectiveLimits(
            max_tokens=self.max_tokens or context_length,
            max_prompt_tokens=self.max_prompt_tokens or context_length,
            body_timeout_s=self.body_timeout_s,
            max_body_bytes=self.max_body_bytes,
            context_length=context_length,
        )


@dataclass(frozen=True)
class EffectiveLimits:
    """The limits in force (None only when the model states no context length and none was set)."""

    max_tokens: int | None
    max_prompt_tokens: int | None
    body_timeout_s: float
    max_body_bytes: int
    context_length: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def context_length(model_args: Any, tokenizer_max_length: Any = None) -> int | None:
    """The context length a model states: its config (`model.args`, or a dict), else its tokenizer's."""
    stated = stated_context_length(as_config(model_args))
    if stated is not None:
        return stated
    if isinstance(tokenizer_max_length, int) and 0 < tokenizer_max_length < UNBOUNDED_TOKENIZER_LENGTH:
        return tokenizer_max_length
    return None
