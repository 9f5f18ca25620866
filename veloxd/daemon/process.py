"""Worker processes at the OS level: spawn in an own process group, drain output, signal, reap.

The supervisor decides; this module only does. Each child gets two reader threads (stdout,
stderr; drained continuously so a chatty worker never blocks on a full pipe) and one waiter
thread, which reports the exit only after both readers reached EOF, so the last lines are in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

from veloxd import protocol
from veloxd.distributed.rank_lines import split_rank
from veloxd.launch import veloxd_argv

TAIL_LINES = 20
READER_JOIN_S = 2.0  # a grandchild keeping the pipe open must not hold up the exit report

LineHandler = Callable[[int, str, str], None]  # (pid, stream, line)
ExitHandler = Callable[[int], None]  # returncode (negative: killed by that signal)


class Lifeline:
    """A pipe whose write end only the daemon holds: workers exit when it reaches EOF.

    The kernel closes the write end however the daemon dies (even SIGKILL), so each worker
    sees EOF on its read end; this works on macOS, which has no PDEATHSIG.
    """

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()  # both non-inheritable; pass_fds shares read_fd

    def close(self) -> None:
        for fd in (self.read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class Child:
    """One spawned worker: its pid (= process group id), output tail, and exit report."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        lifeline: Lifeline | None,
        on_line: LineHandler,
        on_exit: ExitHandler,
        cwd: Path | None = None,
        scrub: Callable[[str], str] | None = None,
        held: bool = False,
    ) -> None:
        pass_fds = (lifeline.read_fd,) if lifeline is not None else ()
        self.argv = list(argv)
        # One tail per stream: a chatty stdout must not push the traceback out of stderr's.
        self.tails: dict[str, deque[str]] = {"stdout": deque(maxlen=TAIL_LINES), "stderr": deque(maxlen=TAIL_LINES)}
        self._on_line = on_line
        self._scrub = scrub  # e.g. removes secret values before a line is kept or logged
        # held: no line is handled until release_output(), so the daemon's event for this start
        # (which names the pid) is logged before anything the worker printed.
        self._released = threading.Event()
        if not held:
            self._released.set()
        self._proc = subprocess.Popen(
            self.argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,  # own session and process group: signals reach its tree
        )
        self.pid: int = self._proc.pid
        self.pgid: int = self.pid
        self.start_time: str | None = process_start_time(self.pid)
        self.returncode: int | None = None
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            _thread(f"out-{self.pid}", self._drain, "stdout", self._proc.stdout),
            _thread(f"err-{self.pid}", self._drain, "stderr", self._proc.stderr),
        ]
        self._waiter = _thread(f"wait-{self.pid}", self._wait, on_exit)

    def release_output(self) -> None:
        self._released.set()

    def _drain(self, stream: str, pipe: IO[bytes]) -> None:
        self._released.wait()  # set right after spawn by the daemon's thread (the pipe buffers meanwhile)
        with pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if self._scrub is not None:
                    line = self._scrub(line)
                self.tails[stream].append(line)
                self._on_line(self.pid, stream, line)

    def _wait(self, on_exit: ExitHandler) -> None:
        code = self._proc.wait()
        for reader in self._readers:
            reader.join(READER_JOIN_S)
        self.returncode = code
        on_exit(code)

    def last_lines(self) -> dict[str, list[str]]:
        """The last lines of each stream (complete once the exit has been reported)."""
        return {stream: list(tail) for stream, tail in self.tails.items()}

    def signal_group(self, signum: int) -> bool:
        """Send `signum` to the worker's whole process group; False if nobody was there."""
        if self._proc.returncode is not None and not _group_exists(self.pgid):
            return False
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def join(self, timeout: float | None = None) -> None:
        """Wait for the waiter thread (tests and shutdown; the daemon gets on_exit instead)."""
        self._waiter.join(timeout)


def _thread(name: str, target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_exit(returncode: int) -> dict[str, object]:
    """`{"code": N}` or `{"signal": "SIGKILL"}` for a Popen returncode."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return {"code": None, "signal": name}
    return {"code": returncode, "signal": None}


def process_start_time(pid: int) -> str | None:
    """When process `pid` started (psutil's create time, as text), or None if it is gone or a zombie.

    Together with the pid it identifies a process across pid reuse.
    """
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None  # a zombie is dead; only its parent has not collected it yet
        return f"{process.create_time():.2f}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_same_process(pid: int, start_time: str | None) -> bool:
    """True if `pid` is alive and started at `start_time` (never trust a bare pid)."""
    return start_time is not None and process_start_time(pid) == start_time


def worker_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The daemon's environment plus the entry's `env`, with unbuffered Python output."""
    env = dict(os.environ)
    env.update(extra)
    env.update(protocol.WORKER_ENV)  # e.g. unbuffered output: a piped child would hold back its READY line
    return env


def default_worker_command() -> list[str]:
    return veloxd_argv("serve")


ERROR_LINE_MAX = 400


def error_line(tail: Mapping[str, list[str]]) -> str | None:
    """The worker's own account of why it exited: its last `veloxd serve: ...` line on stderr, with
    the exception it points at ("see the error above") when there is one; else the last line of a
    Python traceback (`SomeError: message`); else None. A distributed group's lines are read
    without their `[rank N] ` tag: a rank's refusal is its worker's own account."""
    lines = [text.strip() for line in tail.get("stderr", []) if (text := split_rank(line.strip())[1]).strip()]
    said = [line[len(protocol.WORKER_PREFIX) :] for line in lines if line.startswith(protocol.WORKER_PREFIX)]
    said = [line for line in said if not line.startswith("warning:")]
    raised = [line for line in lines if _is_exception_line(line)]
    if said and raised and "see the error above" in said[-1]:
        return _cap(f"{raised[-1]} ({said[-1]})")
    if said:
        return _cap(said[-1])
    return _cap(raised[-1]) if raised else None


def exit_account(tail: Mapping[str, list[str]]) -> str | None:
    """Why a worker exited, in one line, wherever it is shown (status, the console, the verdict):
    its own account (`error_line`), else its last notable stderr line (not routine progress)."""
    notable = protocol.last_notable_line([str(line) for line in tail.get("stderr") or []])
    return error_line(tail) or (_cap(notable) if notable else None)


def _is_exception_line(line: str) -> bool:
    head = line.split(":", 1)[0]
    return ":" in line and head.endswith(("Error", "Exception")) and " " not in head


def _cap(text: str) -> str:
    return text if len(text) <= ERROR_LINE_MAX else text[: ERROR_LINE_MAX - 3] + "..."
