"""The worker's end of the daemon's lifeline, watched from the first moment of the process.

Stdlib only: `veloxd serve` starts this watch before it validates flags or imports MLX, so a
worker whose daemon died (even by SIGKILL) while it was still importing or loading the model
leaves within about a second instead of finishing a load nobody will use.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

from veloxd import protocol
from veloxd.protocol import LIFELINE_GRACE_S, ExitCode


class Stopper:
    """Records the first exit code asked for and stops the HTTP server (from any thread)."""

    def __init__(self) -> None:
        self.code: int | None = None
        self._lock = threading.Lock()
        self.handle: Any = None  # veloxd.serve.mlx_compat.httpd.ServerHandle once bound
        self.stopped = threading.Event()  # set once a stop is asked for (a follower rank waits on it)

    def stop(self, code: int, message: str | None = None) -> None:
        with self._lock:
            if self.code is not None:
                return
            self.code = code
        self.stopped.set()
        if message:
            with contextlib.suppress(OSError):  # the daemon died and nobody reads stderr (EPIPE): still stop
                print(f"{protocol.WORKER_PREFIX}{message}", file=sys.stderr, flush=True)
        if self.handle is not None:
            threading.Thread(target=self.handle.httpd.shutdown, daemon=True).start()


def watch_lifeline(fd: int, stopper: Stopper) -> None:
    """Block on the daemon's pipe; EOF means the daemon died: leave within a second."""
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass
    if stopper.handle is None:  # still importing or loading: nothing to close cleanly, leave now
        stopper.stop(ExitCode.OK, "the daemon's lifeline closed while starting; exiting")
        os._exit(ExitCode.OK)
    threading.Timer(LIFELINE_GRACE_S, os._exit, args=(ExitCode.OK,)).start()  # a clean stop that hangs
    stopper.stop(ExitCode.OK, "the daemon's lifeline closed; exiting")


def start_watch(fd: int | None, stopper: Stopper) -> None:
    if fd is not None:
        threading.Thread(target=watch_lifeline, args=(fd, stopper), name="lifeline", daemon=True).start()
