"""The one module that touches mlx_lm.server internals (tested range: mlx-lm 0.32.x).

It builds the argument namespace mlx_lm's server reads, hooks `ModelProvider._load` (the model
loads on mlx_lm's generation thread, where its arrays must live), subclasses `APIHandler`
(bearer auth, model pinning, a /v1/models that needs no Hugging Face cache, request counters on
GET /veloxd/stats), and runs the
HTTP server with that handler (mlx_lm's own `run()` ignores `handler_class`).
An mlx_lm upgrade that changes any of this breaks here and in tests/test_serve_adapter.py.
"""

from __future__ import annotations

import argparse
import copy
import hmac
import json
import queue
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mlx_lm
from mlx_lm import server as mlx_server

from veloxd.serve.stats import STATS_PATH, RequestStats, RequestTimer

TESTED_RANGE = ((0, 32, 2), (0, 33, 0))

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


def check_version() -> None:
    version = tuple(int(p) for p in mlx_lm.__version__.split(".")[:3])
    low, high = TESTED_RANGE
    if not low <= version < high:
        raise RuntimeError(
            f"mlx-lm {mlx_lm.__version__} is outside veloxd's tested range "
            f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}; install a version in range"
        )


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
        self, cli_args: argparse.Namespace, aliases: set[str], on_loaded: Callable[[Any, Any], bool]
    ) -> None:
        super().__init__(cli_args)
        for alias in aliases:  # every accepted name maps to the one loaded model: no reload
            self._model_map[alias] = cli_args.model
            self._adapter_map[alias] = cli_args.adapter_path
        self._on_loaded = on_loaded
        self.doorbell: Any = None  # a distributed rank's Doorbell, once set up (serve/distributed.py)

    def _load(self, model_path: Any, adapter_path: Any = None, draft_model_path: Any = None) -> None:
        if model_path != self.cli_args.model or adapter_path != self.cli_args.adapter_path or draft_model_path:
            raise ValueError(f"this server serves only {self.cli_args.model}")
        super()._load(model_path, adapter_path, None)
        self.is_batchable = self._on_loaded(self.model, self.tokenizer)


class CountingGenerator:
    """mlx_lm's ResponseGenerator as one request sees it: its tokens counted and timed by `timer`."""

    def __init__(self, inner: Any, timer: RequestTimer) -> None:
        self.inner = inner
        self._timer = timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, request: Any, generation_args: Any, progress_callback: Any = None) -> tuple[Any, Any]:
        ctx, tokens = self.inner.generate(request, generation_args, progress_callback=progress_callback)
        self._timer.prompt(len(ctx.prompt))
        return ctx, self._timer.tokens(tokens)


def handler_class(model_id: str, accepted_names: set[str], api_key: str | None,
                  stats: RequestStats | None = None) -> type:
    """APIHandler with bearer auth, model pinning, a self-contained /v1/models and request counters."""
    counters = stats if stats is not None else RequestStats()

    class VeloxHandler(mlx_server.APIHandler):
        def __init__(self, response_generator: Any, *args: Any, **kwargs: Any) -> None:
            self._shared_generator = response_generator
            self._status = 0
            super().__init__(response_generator, *args, **kwargs)

        def send_response(self, code: int, message: str | None = None) -> None:
            self._status = code
            super().send_response(code, message)

        def _authorized(self) -> bool:
            if api_key is None or self.path == "/health":
                return True
            header = self.headers.get("Authorization", "")
            supplied = header[7:] if header.startswith("Bearer ") else ""
            if hmac.compare_digest(supplied.encode(), api_key.encode()):
                return True
            self._send_error(401, "missing or wrong bearer token", "invalid_api_key")
            return False

        def _send_error(self, status: int, message: str, code: str) -> None:
            self._set_completion_headers(status)
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
            self.wfile.write(json.dumps(body).encode())

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path.split("?")[0] == STATS_PATH:
                self._set_completion_headers(200)
                self.end_headers()
                queued = self._shared_generator.requests.qsize()
                self.wfile.write(json.dumps(counters.to_dict(queued=queued)).encode())
                return
            if self.path.split("?")[0].rstrip("/") in ("/v1/models", f"/v1/models/{model_id}"):
                self._set_completion_headers(200)
                self.end_headers()
                entry = {"id": model_id, "object": "model", "created": self.created, "owned_by": "veloxd"}
                self.wfile.write(json.dumps({"object": "list", "data": [entry]}).encode())
                return
            super().do_GET()

        def do_POST(self) -> None:
            timer = counters.begin()
            self._status = 0
            self.response_generator = CountingGenerator(self._shared_generator, timer)  # type: ignore[assignment]
            try:
                if self._authorized():
                    super().do_POST()
            finally:
                timer.finish(self._status or 500)  # no response sent: the handler failed

        def handle_completion(self, request: Any, stop_words: list[str]) -> None:
            if self.requested_model == "default_model":
                self.requested_model = model_id  # responses name the served model
            wrong = [
                value
                for value, allowed in (
                    (self.requested_model, accepted_names),
                    (self.requested_draft_model, {"default_model"}),
                )
                if value not in allowed
            ]
            if self.adapter is not None:
                wrong.append(f"adapters={self.adapter}")
            if wrong:
                self._send_error(
                    404,
                    f"this server serves only model '{model_id}'; refused {', '.join(map(str, wrong))}",
                    "model_not_found",
                )
                return
            super().handle_completion(request, stop_words)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # request lines stay out of the daemon's log; mlx_lm logs what matters

    return VeloxHandler


IDLE_POLL_S = 1.0  # mlx_lm polls every 0.1 s; in a group each poll is a collective on every rank


class LockstepGenerator(mlx_server.ResponseGenerator):
    """mlx_lm's ResponseGenerator; in a distributed group, idle ranks sleep instead of spinning.

    mlx_lm ends every poll of rank 0's request queue in an `all_sum` that every follower waits
    in, and MLX's ring backend waits by spinning. With a doorbell (`model_provider.doorbell`,
    veloxd/serve/doorbell.py) rank 0 tells the followers per poll whether a request is shared,
    and the collective runs only then; the followers block in `recv` meanwhile. Without one,
    idle polls are spaced out to IDLE_POLL_S (a request still wakes rank 0's queue at once).
    """

    def _next_request(self, timeout: float | None = None) -> Any:
        if not self._is_distributed:
            return super()._next_request(timeout)
        if timeout is not None:
            timeout = max(timeout, IDLE_POLL_S)
        bell = getattr(self.model_provider, "doorbell", None)
        if bell is None:
            return super()._next_request(timeout)
        if self._rank != 0:
            return self._share_request(None) if bell.wait() else None
        try:
            request = self.requests.get(timeout=timeout) if timeout is not None else self.requests.get_nowait()
        except queue.Empty:
            request = None
        bell.ring(request is not None)
        return None if request is None else self._share_request(request)


def start_generator(provider: PinnedProvider) -> LockstepGenerator:
    """mlx_lm's generation thread (it loads the model first), without an HTTP server: a follower rank."""
    return LockstepGenerator(provider, mlx_server.LRUPromptCache(provider.cli_args.prompt_cache_size))


class ServerHandle:
    """The bound HTTP server and mlx_lm's response generator, for serve_forever/shutdown."""

    def __init__(self, host: str, port: int, provider: PinnedProvider, handler: type) -> None:
        infos = mlx_server.socket.getaddrinfo(host, port, type=mlx_server.socket.SOCK_STREAM, flags=mlx_server.socket.AI_PASSIVE)
        family, _, _, _, address = infos[0]
        server_class = type("VeloxHTTPServer", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        # Bind before the model loads: once READY is printed, the port is already listening.
        self.httpd = server_class(address, self._make_handler)
        self._handler = handler
        self.generator = start_generator(provider)

    def _make_handler(self, *args: Any, **kwargs: Any) -> Any:
        fingerprint = mlx_server.get_system_fingerprint()
        return self._handler(self.generator, *args, system_fingerprint=fingerprint, **kwargs)

    def generation_alive(self) -> bool:
        return self.generator.is_healthy

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def close(self, join_timeout: float) -> None:
        """After serve_forever returned: stop the generation thread (bounded wait), free the port."""
        self.generator._stop = True  # upstream's stop flag; stop_and_join would wait unbounded
        self.generator._generation_thread.join(join_timeout)
        self.httpd.server_close()


def model_names(model: str) -> tuple[str, set[str]]:
    """The id /v1/models reports, and every name a request may use for it."""
    path = Path(model).expanduser()
    if path.exists():
        model_id = str(path.resolve())
        return model_id, {"default_model", model, model_id, path.name}
    return model, {"default_model", model}
