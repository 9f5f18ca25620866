"""The worker's end of the daemon's lifeline, watched from the first moment of the process.

Stdlib only: `veloxd serve` starts this watch before it validates flags or imports MLX, so a
worker whose daemon died (even by SIGKILL) while it was still importing or loading the model
leaves within about a second instead of finishing a load nobody will use.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
from typing import Any

from veloxd import lifeline, protocol
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

    def stop_on_signals(self, *signums: int) -> None:
        """Each of `signums` stops as stop(OK) does. The handler only enqueues: one that took the
        lock could deadlock with the very stop() it interrupted; a thread does the work."""
        asked: queue.SimpleQueue[int] = queue.SimpleQueue()  # put() is safe from a signal handler
        for signum in signums:
            signal.signal(signum, lambda number, _frame: asked.put(number))

        def stop_when_asked() -> None:
            asked.get()
            self.stop(ExitCode.OK)

        threading.Thread(target=stop_when_asked, name="signals", daemon=True).start()


def on_lifeline_closed(stopper: Stopper) -> None:
    """The daemon died: leave within LIFELINE_GRACE_S."""
    if stopper.handle is None:  # still importing or loading: nothing to close cleanly, leave now
        stopper.stop(ExitCode.OK, "the daemon's lifeline closed while starting; exiting")
        os._exit(ExitCode.OK)
    lifeline.exit_after(LIFELINE_GRACE_S, ExitCode.OK)  # a clean stop that hangs
    stopper.stop(ExitCode.OK, "the daemon's lifeline closed; exiting")


def start_watch(fd: int | None, stopper: Stopper) -> None:
    if fd is not None:
        lifeline.watch(fd, lambda: on_lifeline_closed(stopper))
