"""The one door to mlx_lm's internals (tested range: mlx-lm 0.32.x).

No other veloxd module names a private mlx_lm attribute (tests/serve/test_serve_mlx_compat.py
checks the package for it and pins every name used here): the cache base class, the
architecture lookup, the generation thread, and mlx_lm.server's hooks below.

It builds the argument namespace mlx_lm's server reads, hooks `ModelProvider._load` (the model
loads on mlx_lm's generation thread, where its arrays must live), subclasses `APIHandler`
(bearer auth, model pinning, a /v1/models that needs no Hugging Face cache, request counters on
GET /veloxd/stats, request limits),
subclasses `ResponseGenerator` (a request whose client left, or a shutdown, stops generating),
and runs the HTTP server with that handler (mlx_lm's own `run()` ignores `handler_class`).
An mlx_lm upgrade that changes any of this breaks here and in tests/serve/test_serve_mlx_compat.py.
"""

from __future__ import annotations

import argparse
import copy
import hmac
import io
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from queue import Empty
from types import SimpleNamespace
from typing import Any, cast

import mlx_lm
from mlx_lm import server as mlx_server
from mlx_lm.models.cache import _BaseCache

from veloxd.serve.bounds import (
    BodyRefused,
    ClientGone,
    HeaderDeadline,
    PromptTooLong,
    RequestCancelled,
    RequestWatch,
    check_json_body,
    client_gone_error,
    read_body,
)
from veloxd.serve.limits import RequestLimits, context_length
from veloxd.serve.stats import STATS_PATH, RequestStats, RequestTimer

TESTED_RANGE = ((0, 32, 2), (0, 33, 0))

# mlx_lm's cache base class: its defaults (is_trimmable, state, meta_state) are the cache protocol.
BaseCache = _BaseCache


def model_classes(config: dict[str, Any]) -> tuple[type, type]:
    """(Model, ModelArgs) for a config.json, with model_type remapping exactly as mlx_lm's load()."""
    from mlx_lm.utils import _get_classes

    return cast(tuple[type, type], _get_classes(config))


def generation_thread(generator: mlx_server.ResponseGenerator) -> threading.Thread:
    """The thread that runs every generation (and, through PinnedProvider, the model load)."""
    return generator._generation_thread


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
        self.is_batchable = self._on_loaded(self.model, self.tokenizer)
        self.loaded.set()


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


class StoppableGenerator(LockstepGenerator):
    """mlx_lm's generator, plus: each request's generation stops when its `RequestWatch` is cancelled.

    A handler registers its watch for the duration of a request (`watching`). While it waits for
    tokens, `_await_response` (on the handler's thread) peeks at the client's socket and, once the
    client has gone, stops the request's GenerationContext, which both of mlx_lm's paths (batched
    and single) check after every prefill chunk and every token. A request cancelled before the
    generation thread reached it is dropped in `_tokenize`, before its prefill. `_tokenize` also
    refuses a prompt over `limits.max_prompt_tokens` (the handler counts it first, to answer 400;
    this is the guarantee that no such prompt is ever prefilled).
    """

    def __init__(self, provider: PinnedProvider, prompt_cache: Any) -> None:
        self.watches: dict[int, RequestWatch] = {}  # id(CompletionRequest) -> watch
        self._local = threading.local()  # the watch of the request this handler thread serves
        self._lock = threading.Lock()
        super().__init__(provider, prompt_cache)

    def watching(self, request: Any, watch: RequestWatch) -> _Watching:
        return _Watching(self, request, watch)

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            watches = list(self.watches.values())
        for watch in watches:
            watch.cancel(reason)

    def prompt_tokens(self, request: Any, chat_template_kwargs: Any) -> int:
        """Tokens of `request`'s prompt, counted as the generation thread will (chat template included)."""
        tokenizer = self.model_provider.tokenizer
        args = SimpleNamespace(chat_template_kwargs=chat_template_kwargs)  # all _tokenize reads of args
        return len(mlx_server.ResponseGenerator._tokenize(self, tokenizer, request, args)[0])

    def _tokenize(self, tokenizer: Any, request: Any, args: Any) -> Any:
        watch = self.watches.get(id(request))
        if watch is not None and watch.reason is not None:
            raise RequestCancelled(watch.reason)  # reaches the handler as this request's answer
        tokenized = super()._tokenize(tokenizer, request, args)
        limit = cast(PinnedProvider, self.model_provider).limits.max_prompt_tokens
        if limit is not None and len(tokenized[0]) > limit:
            raise PromptTooLong(len(tokenized[0]), limit)
        return tokenized

    def _await_response(self, response_queue: Any) -> Any:
        watch: RequestWatch | None = getattr(self._local, "watch", None)
        if watch is None:
            return super()._await_response(response_queue)
        while True:
            if watch.reason is None and watch.client_gone():
                watch.cancel("client_disconnected")
            if watch.reason is not None and watch.ctx is not None:
                raise RequestCancelled(watch.reason)
            try:
                item = response_queue.get(timeout=0.1)
            except Empty:
                if not self.generation_available():
                    raise RuntimeError("generation thread died") from None
                continue
            if isinstance(item, mlx_server.GenerationContext):
                watch.ctx = item
                if watch.reason is not None:
                    item.stop()
            elif isinstance(item, mlx_server.Response):
                watch.tokens += 1
            return item


class _Watching:
    """Registers a request's watch with the generator for a `with` block."""

    def __init__(self, generator: StoppableGenerator, request: Any, watch: RequestWatch) -> None:
        self._generator, self._key, self._watch = generator, id(request), watch

    def __enter__(self) -> RequestWatch:
        with self._generator._lock:
            self._generator.watches[self._key] = self._watch
        self._generator._local.watch = self._watch
        return self._watch

    def __exit__(self, *exc: object) -> None:
        self._generator._local.watch = None
        with self._generator._lock:
            self._generator.watches.pop(self._key, None)
        if self._watch.ctx is not None:
            self._watch.ctx.stop()  # whatever ended the request, its generation ends too


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


def handler_class(
    model_id: str,
    accepted_names: set[str],
    api_key: str | None,
    stats: RequestStats | None = None,
    limits: RequestLimits | None = None,
) -> type:
    """APIHandler with bearer auth, model pinning, a self-contained /v1/models, request counters and limits.

    Long: one handler class whose methods share this closure's settings (served names, key,
    counters, limits); mlx_lm constructs it per connection, so they cannot be passed in.
    """
    counters = stats if stats is not None else RequestStats()
    bounds = limits or RequestLimits()

    class VeloxHandler(mlx_server.APIHandler):
        timeout = bounds.body_timeout_s  # per socket read; the request line and headers also in total

        def __init__(self, response_generator: Any, *args: Any, **kwargs: Any) -> None:
            self._shared_generator = response_generator
            self._status = 0
            super().__init__(response_generator, *args, **kwargs)

        def setup(self) -> None:
            super().setup()
            self._reader = HeaderDeadline(self.rfile, self.connection)  # type: ignore[arg-type]
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            """Request line and headers within `timeout` in total (a keep-alive wait for the next one too)."""
            self._reader.deadline = time.monotonic() + self.timeout
            super().handle_one_request()
            if self._reader.expired:
                self._reader.deadline = None
                logging.debug("request_headers_timed_out timeout_s=%g", self.timeout)

        def parse_request(self) -> bool:
            parsed = super().parse_request()
            self._reader.deadline = None  # headers are in: the body has its own bound (read_body)
            self.connection.settimeout(self.timeout)
            return parsed

        def send_response(self, code: int, message: str | None = None) -> None:
            self._status = code
            super().send_response(code, message)

        def _authorized(self) -> bool:
            if api_key is None or self.path == "/health":
                return True
            header = self.headers.get("Authorization", "")
            scheme, _, token = header.strip().partition(" ")
            supplied = token.strip() if scheme.lower() == "bearer" else ""  # schemes are case-insensitive (RFC 7235)
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
                    self._post()
            finally:
                timer.finish(self._status or 500)  # no response sent: the handler failed

        def _post(self) -> None:
            """The body within its limits, then mlx_lm's do_POST reading it from memory."""
            try:
                body = read_body(
                    self.rfile,
                    self.connection,
                    self.headers.get("Content-Length"),
                    max_bytes=bounds.max_body_bytes,
                    timeout_s=bounds.body_timeout_s,
                    idle_timeout_s=self.timeout,
                )
            except BodyRefused as refused:
                logging.warning("request_refused reason=%s status=%d", refused.code, refused.status)
                self.close_connection = True
                self._send_error(refused.status, refused.message, refused.code)
                return
            except (ClientGone, OSError):
                self.close_connection = True
                return
            if body is None:  # no usable Content-Length: mlx_lm answers 411 or 400
                super().do_POST()
                return
            if self.path in POST_PATHS:
                try:
                    check_json_body(body)  # before mlx_lm's parse: its own answers are a traceback or a 404
                except BodyRefused as refused:
                    logging.warning("request_refused reason=%s status=%d", refused.code, refused.status)
                    self._send_error(refused.status, refused.message, refused.code)
                    return
            socket_file, self.rfile = self.rfile, io.BytesIO(body)
            try:
                super().do_POST()
            finally:
                self.rfile = socket_file

        def handle_completion(self, request: Any, stop_words: list[str]) -> None:
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
            self.requested_model = model_id  # responses name the served model, whichever accepted name was used
            generator = cast(StoppableGenerator, self._shared_generator)
            provider = cast(PinnedProvider, generator.model_provider)
            while not provider.loaded.wait(1.0):  # a request that beat the model load waits for it
                if not generator.generation_available():
                    self._send_error(503, "the model failed to load", "server_error")
                    return
            effective = provider.limits
            requested = cast(int, self.max_tokens)  # mlx_lm validated it (an int >= 1) before this call
            if effective.max_tokens is not None and requested > effective.max_tokens:
                logging.info("max_tokens_capped requested=%d limit=%d", requested, effective.max_tokens)
                self.max_tokens = effective.max_tokens  # finish_reason "length" tells the client
            if effective.max_prompt_tokens is not None and not self._prompt_fits(request, effective.max_prompt_tokens):
                return
            watch = RequestWatch(self.connection)
            try:
                with generator.watching(request, watch):
                    super().handle_completion(request, stop_words)
            except (RequestCancelled, ConnectionError) as err:
                reason = watch.reason or ("client_disconnected" if isinstance(err, ConnectionError) else str(err))
                self.close_connection = True
                logging.warning(
                    "request_cancelled reason=%s completion_tokens=%d max_tokens=%d",
                    reason,
                    watch.tokens,
                    self.max_tokens,
                )

        def _prompt_fits(self, request: Any, limit: int) -> bool:
            """Count the prompt's tokens before any prefill; answer 400 naming both numbers if too long."""
            try:
                generator = cast(StoppableGenerator, self._shared_generator)
                count = generator.prompt_tokens(request, self.chat_template_kwargs)
            except Exception:  # malformed: mlx_lm reports it; the generation thread still enforces the limit
                return True
            if count <= limit:
                return True
            logging.warning(
                "request_refused reason=prompt_too_long prompt_tokens=%d max_prompt_tokens=%d", count, limit
            )
            self._send_error(400, str(PromptTooLong(count, limit)), "context_length_exceeded")
            return False

        def log_message(self, format: str, *args: Any) -> None:
            pass  # request lines stay out of the daemon's log; mlx_lm logs what matters

    return VeloxHandler


def start_generator(provider: PinnedProvider) -> StoppableGenerator:
    """mlx_lm's generation thread (it loads the model first); alone it is a follower rank's whole server."""
    return StoppableGenerator(provider, mlx_server.LRUPromptCache(provider.cli_args.prompt_cache_size))


POST_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")  # mlx_lm's do_POST routes
LISTEN_BACKLOG = 128  # socketserver's default of 5 refuses a burst of connections


class VeloxHTTPServer(ThreadingHTTPServer):
    """mlx_lm's threading server: a normal listen backlog, and a client that left is no traceback."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if client_gone_error(err):
            logging.debug("client_gone error=%s", type(err).__name__)
            return
        logging.error("request_failed error=%r", err, exc_info=True)


class ServerHandle:
    """The bound HTTP server and mlx_lm's response generator, for serve_forever/shutdown."""

    def __init__(self, host: str, port: int, provider: PinnedProvider, handler: type) -> None:
        infos = mlx_server.socket.getaddrinfo(
            host, port, type=mlx_server.socket.SOCK_STREAM, flags=mlx_server.socket.AI_PASSIVE
        )
        family, _, _, _, address = infos[0]
        server_class = type("VeloxHTTPServer", (VeloxHTTPServer,), {"address_family": family})
        # Bind before the model loads: once READY is printed, the port is already listening.
        self.httpd = server_class(address, self._make_handler)
        self._handler = handler
        self._fingerprint = mlx_server.get_system_fingerprint()  # once: no MLX call per connection
        self.generator = start_generator(provider)

    def _make_handler(self, *args: Any, **kwargs: Any) -> Any:
        return self._handler(self.generator, *args, system_fingerprint=self._fingerprint, **kwargs)

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def close(self, join_timeout: float) -> None:
        """After serve_forever returned: stop every request and the generation thread (bounded wait), free the port.

        A prefill chunk or a decode step in progress finishes first; if that takes longer than
        `join_timeout`, the caller leaves anyway (the process exits, the thread with it).
        """
        self.generator.cancel_all("shutdown")
        self.generator._stop = True  # upstream's stop flag; stop_and_join would wait unbounded
        generation_thread(self.generator).join(join_timeout)
        self.httpd.server_close()


def model_names(model: str) -> tuple[str, set[str]]:
    """The id /v1/models reports, and every name a request may use for it."""
    path = Path(model).expanduser()
    if path.exists():
        model_id = str(path.resolve())
        return model_id, {"default_model", model, model_id, path.name}
    return model, {"default_model", model}
