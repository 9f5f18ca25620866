"""The child's end of a lifeline: the read end of a pipe whose only write end the parent holds.

The kernel closes the write end however the parent dies (even SIGKILL, where no handler runs),
so EOF here means the parent is gone; macOS has no PDEATHSIG, this works everywhere. Every
process veloxd supervises watches one (workers, the gateway, the dashboard, a download child),
and so does the daemon under a wrapper (`veloxd run --lifeline-fd`). Stdlib only: a worker
starts its watch before it imports MLX.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable

from veloxd.protocol import LIFELINE_GRACE_S, ExitCode


def wait_eof(fd: int) -> None:
    """Block until fd reaches EOF (bytes written to it are ignored) or fails."""
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass


def watch(fd: int, on_eof: Callable[[], object], name: str = "lifeline") -> None:
    """Call `on_eof` on a daemon thread once fd reaches EOF (it should only enqueue or signal)."""

    def wait_then_call() -> None:
        wait_eof(fd)
        on_eof()

    threading.Thread(target=wait_then_call, name=name, daemon=True).start()


def exit_after(grace_s: float, code: int) -> None:
    """Leave with `code` in `grace_s` whatever else happens: a clean stop that hangs still ends.

    Not a daemon thread on purpose: an interpreter whose shutdown hangs (a native thread that
    does not stop) waits for it, and it ends the process."""
    threading.Timer(grace_s, os._exit, args=(code,)).start()


def stop_on_eof(fd: int, stop: asyncio.Event, who: str) -> None:
    """For an asyncio process (the gateway, the dashboard): EOF sets `stop` on its loop, and the
    process leaves with ExitCode.OK within LIFELINE_GRACE_S whatever happens. Call it on the loop."""
    loop = asyncio.get_running_loop()

    def daemon_gone() -> None:
        exit_after(LIFELINE_GRACE_S, ExitCode.OK)
        stop.set()
        with contextlib.suppress(OSError):  # the daemon died: nobody may read stderr any more (EPIPE)
            print(f"{who}: the daemon's lifeline closed; exiting", file=sys.stderr, flush=True)

    watch(fd, lambda: loop.call_soon_threadsafe(daemon_gone))
