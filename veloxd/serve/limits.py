"""Bounds on the work one request may cause, and the model facts that resolve their defaults.

`limits.max_tokens` and `limits.max_prompt_tokens` default to the model's context length, which
only the loaded model knows: the worker resolves them after loading and reports the effective
values in its READY line. No mlx import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Where model configs state their context length, most common first (llama/qwen/mistral, gpt2,
# mpt, chatglm/qwen1, phi/bloom-likes). A VLM's text model nests it in text_config.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx", "max_sequence_length")
UNBOUNDED_TOKENIZER_LENGTH = 10**9  # transformers' "no limit" sentinel is ~1e30


@dataclass(frozen=True)
class RequestLimits:
    """What `veloxd serve` was asked to enforce; None: the model's context length."""

    max_tokens: int | None = None
    max_prompt_tokens: int | None = None
    body_timeout_s: float = 30.0
    max_body_bytes: int = 32 * 2**20

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
    sources = [model_args, _get(model_args, "text_config")]
    for source in sources:
        for key in CONTEXT_KEYS:
            value = _get(source, key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    if isinstance(tokenizer_max_length, int) and 0 < tokenizer_max_length < UNBOUNDED_TOKENIZER_LENGTH:
        return tokenizer_max_length
    return None


def _get(source: Any, key: str) -> Any:
    if source is None:
        return None
    return source.get(key) if isinstance(source, dict) else getattr(source, key, None)
