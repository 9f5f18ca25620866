"""mlx_lm's ResponseGenerator, made stoppable per request and quiet on idle distributed ranks."""

from __future__ import annotations

import queue
import threading
from queue import Empty
from types import SimpleNamespace
from typing import Any, cast

from mlx_lm import server as mlx_server

from veloxd.serve.bounds import PromptTooLong, RequestCancelled, RequestWatch
from veloxd.serve.mlx_compat.provider import PinnedProvider
from veloxd.serve.stats import RequestTimer


def generation_thread(generator: mlx_server.ResponseGenerator) -> threading.Thread:
    """The thread that runs every generation (and, through PinnedProvider, the model load)."""
    return generator._generation_thread


class GenerationUnavailable(RuntimeError):
    """The generation thread is gone (the model failed to load, or the thread died): no request can be served."""


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
                    raise GenerationUnavailable("the generation thread has stopped") from None
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
        self.failure: Exception | None = None  # what generate() raised: mlx_lm answers any of it with a 404

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, request: Any, generation_args: Any, progress_callback: Any = None) -> tuple[Any, Any]:
        try:
            ctx, tokens = self.inner.generate(request, generation_args, progress_callback=progress_callback)
        except Exception as err:
            self.failure = err
            raise
        self._timer.prompt(len(ctx.prompt))
        return ctx, self._timer.tokens(tokens)


def start_generator(provider: PinnedProvider) -> StoppableGenerator:
    """mlx_lm's generation thread (it loads the model first); alone it is a follower rank's whole server."""
    return StoppableGenerator(provider, mlx_server.LRUPromptCache(provider.cli_args.prompt_cache_size))
