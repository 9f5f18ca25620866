"""What a model's config.json states about its context length, read one way everywhere.

The worker's request limits (veloxd/serve/limits.py, which then falls back to the tokenizer), the
READY memory figure (veloxd/kv/footprint.py) and the daemon's memory admission
(veloxd/daemon/memory.py, which bills its DEFAULT_CONTEXT when the config states none) all read
it through `stated_context_length`. Stdlib only: the daemon imports it, and never mlx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Where model configs state their context length, most common first (llama/qwen/mistral, gpt2,
# mpt, chatglm/qwen1, phi/bloom-likes). A wrapper (a VLM) nests its text model's in text_config.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx", "max_sequence_length")
WRAPPED = "text_config"


def stated_context_length(config: Mapping[str, Any]) -> int | None:
    """The context length a parsed config.json states: the first positive integer under one of
    CONTEXT_KEYS (in that order) at its top level, else in its text_config; None when neither has one."""
    for source in (config, config.get(WRAPPED)):
        if not isinstance(source, Mapping):
            continue
        for key in CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def as_config(args: Any) -> Mapping[str, Any]:
    """A loaded model's `args` (mlx_lm's ModelArgs: config.json's keys as attributes; a dict for
    some models) as the mapping `stated_context_length` reads, its text_config included."""
    config = _mapping(args)
    wrapped = config.get(WRAPPED)
    if wrapped is not None and not isinstance(wrapped, Mapping):
        config = {**config, WRAPPED: _mapping(wrapped)}
    return config


def _mapping(source: Any) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    return vars(source) if hasattr(source, "__dict__") else {}
