"""The HTTP server a worker runs with veloxd's handler (mlx_lm's own `run()` ignores `handler_class`)."""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer
from typing import Any

from mlx_lm import server as mlx_server

from veloxd.serve.bounds import client_gone_error
from veloxd.serve.mlx_compat.generators import generation_thread, start_generator
from veloxd.serve.mlx_compat.provider import PinnedProvider

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
