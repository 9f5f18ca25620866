"""mlx_lm's APIHandler with bearer auth, model pinning, a self-contained /v1/models, counters and limits."""

from __future__ import annotations

import hmac
import io
import json
import logging
import time
from typing import Any, cast

from mlx_lm import server as mlx_server

from veloxd.openai_errors import error_type, openai_error
from veloxd.serve import request_fields
from veloxd.serve.bounds import (
    BodyRefused,
    ClientGone,
    HeaderDeadline,
    PromptTooLong,
    RequestCancelled,
    RequestWatch,
    check_json_body,
    read_body,
)
from veloxd.serve.limits import RequestLimits
from veloxd.serve.mlx_compat.errors import ShapedWriter
from veloxd.serve.mlx_compat.generators import CountingGenerator, GenerationUnavailable, StoppableGenerator
from veloxd.serve.mlx_compat.provider import PinnedProvider
from veloxd.serve.stats import STATS_PATH, RequestStats

POST_PATHS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")  # mlx_lm's do_POST routes


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
            self._error_status: int | None = None  # set by _set_completion_headers, used by end_headers
            super().__init__(response_generator, *args, **kwargs)

        def setup(self) -> None:
            super().setup()
            self.wfile = ShapedWriter(self.wfile)  # type: ignore[assignment]
            self._reader = HeaderDeadline(self.rfile, self.connection)  # type: ignore[arg-type]
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            """Request line and headers within `timeout` in total (a keep-alive wait for the next one too)."""
            self._status = 0  # nothing answered yet to this request (a keep-alive connection has had others)
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

        def _set_completion_headers(self, status_code: int = 200) -> None:
            failure = getattr(self.response_generator, "failure", None)
            if status_code == 404 and failure is not None:  # mlx_lm's answer to any failure of generate()
                if isinstance(failure, RequestCancelled):
                    raise failure  # the client has gone: nothing to answer; handle_completion logs it
                status_code = 503 if isinstance(failure, GenerationUnavailable) else 400
            super()._set_completion_headers(status_code)
            self._error_status = status_code if status_code >= 400 else None

        def end_headers(self) -> None:
            super().end_headers()  # the headers' own write goes out as is
            if self._error_status is not None:  # the body comes next: in OpenAI's shape (errors.py)
                self.wfile.expect(self._error_status)  # type: ignore[attr-defined]
                self._error_status = None

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

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """http.server's own refusals (a malformed request line, 501 for PUT) in OpenAI's shape, not HTML."""
            text = message or self.responses.get(code, ("error",))[0]
            body = json.dumps(openai_error(code, text, code=error_type(code))).encode()
            self.send_response(code, message)
            self.send_header("Connection", "close")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _send_error(self, status: int, message: str, code: str, **extra: Any) -> None:
            self._set_completion_headers(status)
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(json.dumps(openai_error(status, message, code, **extra)).encode())

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
                    data = check_json_body(body)  # before mlx_lm's parse: its own answers are a traceback or a 404
                except BodyRefused as refused:
                    logging.warning("request_refused reason=%s status=%d", refused.code, refused.status)
                    self._send_error(refused.status, refused.message, refused.code)
                    return
                found = request_fields.problem(self.path, data)
                if found is not None:
                    logging.warning("request_refused reason=invalid_field param=%s status=400", found.param)
                    self._send_error(400, found.message, "invalid_request_error", param=found.param)
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
            except Exception as err:  # one mlx_lm does not answer: a 500 in OpenAI's shape, never a dropped connection
                logging.exception("request_failed error=%s", f"{type(err).__name__}: {err}")
                self.close_connection = True
                if not self._status:  # else the answer has begun: closing the connection is all that is left
                    self._send_error(
                        500, f"the server failed on this request ({type(err).__name__}: {err})", "server_error"
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
