"""mlx_lm.server's argument namespace and model provider, pinned to the one model a worker serves."""

from __future__ import annotations

import argparse
import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlx_lm import server as mlx_server

from veloxd.serve.limits import RequestLimits, context_length

# mlx_lm 0.32.2 `server.main()` defaults (a contract test compares them with upstream's parser).
UPSTREAM_DEFAULTS: dict[str, Any] = {
    "model": None,
    "adapter_path": None,
    "host": "127.0.0.1",
    "port": 8080,
    "allowed_origins": ["*"],
    "draft_model": None,
    "num_draft_tokens": 3,
    "trust_remote_code": False,
    "log_level": "INFO",
    "chat_template": "",
    "use_default_chat_template": False,
    "temp": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "max_tokens": 512,
    "chat_template_args": {},
    "decode_concurrency": 32,
    "prompt_concurrency": 8,
    "prefill_step_size": 2048,
    "prompt_cache_size": 10,
    "prompt_cache_bytes": None,
    "kv_bits": None,
    "kv_group_size": 64,
    "quantized_kv_start": 5000,
    "pipeline": False,
}


def server_args(**overrides: Any) -> argparse.Namespace:
    """mlx_lm's server namespace: upstream defaults, then every non-None override."""
    values = copy.deepcopy(UPSTREAM_DEFAULTS)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return argparse.Namespace(**values)


class PinnedProvider(mlx_server.ModelProvider):
    """Loads exactly one model (on the generation thread) and hands it to `on_loaded`.

    `on_loaded(model, tokenizer) -> bool` wires the caches and returns whether requests may be
    batched. A request for any other model, adapter or draft model is refused, never loaded.
    """

    def __init__(
        self,
        cli_args: argparse.Namespace,
        aliases: set[str],
        on_loaded: Callable[[Any, Any], bool],
        limits: RequestLimits | None = None,
    ) -> None:
        super().__init__(cli_args)
        self.loaded = threading.Event()
        self.request_limits = limits or RequestLimits()
        self.limits = self.request_limits.resolve(None)  # resolved against the context length on load
        for alias in aliases:  # every accepted name maps to the one loaded model: no reload
            self._model_map[alias] = cli_args.model
            self._adapter_map[alias] = cli_args.adapter_path
        self._on_loaded = on_loaded
        self.doorbell: Any = None  # a distributed rank's Doorbell, once set up (serve/distributed.py)

    def _load(self, model_path: Any, adapter_path: Any = None, draft_model_path: Any = None) -> None:
        if model_path != self.cli_args.model or adapter_path != self.cli_args.adapter_path or draft_model_path:
            raise ValueError(f"this server serves only {self.cli_args.model}")
        super()._load(model_path, adapter_path, None)
        context = context_length(getattr(self.model, "args", None), getattr(self.tokenizer, "model_max_length", None))
        self.limits = self.request_limits.resolve(context)
        tokenizer = self.tokenizer
        if tokenizer is not None and hasattr(tokenizer, "model_max_length"):
            # The worker refuses a long prompt itself (a 400 before any prefill, after counting its
            # tokens); transformers would also warn on stderr at every such count.
            tokenizer.model_max_length = int(1e30)  # transformers' own "no limit" (VERY_LARGE_INTEGER)
        self.is_batchable = self._on_loaded(self.model, self.tokenizer)
        self.loaded.set()


def model_names(model: str) -> tuple[str, set[str]]:
    """The id /v1/models reports, and every name a request may use for it."""
    path = Path(model).expanduser()
    if path.exists():
        model_id = str(path.resolve())
        return model_id, {"default_model", model, model_id, path.name}
    return model, {"default_model", model}
