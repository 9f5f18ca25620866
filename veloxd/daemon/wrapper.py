"""The daemon's own lifeline: `veloxd run --lifeline-fd N` stops the daemon when N reaches EOF.

For a wrapper that runs the daemon as its child (make run's demo): it keeps the write end of a
pipe and the daemon the read end. The kernel closes the write end however the wrapper dies
(even SIGKILL, where no handler runs), so the daemon stops its servers and exits instead of
staying on the wrapper's ports. The same pattern the daemon uses for its workers
(veloxd.daemon.process.Lifeline); works on macOS, which has no PDEATHSIG.
"""

from __future__ import annotations

import os
import queue
import stat
from typing import Any

from veloxd import lifeline
from veloxd.daemon import messages as m
from veloxd.daemon.statefile import StartupError


def check_lifeline_fd(fd: int) -> None:
    """Raise StartupError unless fd is an open pipe or socket this process inherited."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as err:
        raise StartupError(f"--lifeline-fd {fd}: not an open descriptor ({err.strerror or err})") from None
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise StartupError(f"--lifeline-fd {fd}: not a pipe or socket (a wrapper passes the read end of a pipe)")
    os.set_inheritable(fd, False)  # the workers have their own lifeline; they must not hold this one


def watch_wrapper(fd: int, inbox: queue.SimpleQueue[Any]) -> None:
    """Enqueue WrapperGone once fd reaches EOF (a daemon thread: it only enqueues)."""
    lifeline.watch(fd, lambda: inbox.put(m.WrapperGone(fd)), name="wrapper-lifeline")
