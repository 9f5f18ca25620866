"""The group process of a distributed entry: MLX's launcher, with veloxd's process pump.

    python -m veloxd.distributed.launcher --lifeline-fd N <mlx.launch flags> -- <rank command>

MLX's launcher (`mlx._distributed_utils.launch.main`) does everything it normally does: it reads
the hosts or the hostfile, picks the backend, writes the ring/jaccl host list and environment,
and builds each rank's launch script (run locally for 127.0.0.1, over `ssh` otherwise), with its
remote kill script. Only its I/O loop, `_launch_with_io`, is replaced by `Pump`, because that
loop (mlx 0.32) cannot be supervised as one unit:
- it spins: it selects for writability on every rank's stdin pipe, which is always writable, and
  polls its own stdin every 0.1 s (about 20-40 % of a core while the server idles);
- a rank that exits with code 0 leaves the others running (blocked forever in a collective);
- it returns no exit code, and mixes the ranks' output chunks (no rank, lines cut in two);
- nothing ends it when the daemon dies.
The pump blocks instead of polling, stops every rank when any rank ends, tags each complete line
with its rank (`[rank N] ...`), exits 0 (stopped), 2 (a rank refused its input: retrying cannot
help) or 3 (a rank failed or left), and treats EOF on the daemon's lifeline like SIGTERM, with a
hard SIGKILL of its whole process group (itself, local ranks, ssh clients) if that stalls.
Each rank's stdin is a pipe this process never writes: EOF on it (this process died) is the
rank's own lifeline (`veloxd serve --lifeline-fd 0`); a remote rank also gets SIGHUP from ssh.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any

from veloxd import lifeline
from veloxd.distributed.rank_lines import tag

STOP_GRACE_S = 20.0  # after SIGTERM to the ranks, kill the local processes still there
LIFELINE_HARD_S = 30.0  # daemon gone: the whole process group is SIGKILLed after this at the latest
EXIT_STOPPED, EXIT_UNFIXABLE, EXIT_FAILED = 0, 2, 3


class Rank:
    """One rank: MLX's command object (RemoteProcess), its output readers and its waiter."""

    def __init__(self, rank: int, command: Any, out: Callable[[bool, str], None], events: queue.SimpleQueue) -> None:
        self.rank = rank
        self.command = command
        self.process = command.process
        self.host = getattr(command, "_host", "?")
        self._out = out
        self.returncode: int | None = None
        self._readers = [
            _thread(self._read, self.process.stdout, True),
            _thread(self._read, self.process.stderr, False),
        ]
        self.done = _thread(self._wait, events)

    def _read(self, pipe: IO[bytes], is_stdout: bool) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        fd = pipe.fileno()
        while True:
            try:
                data = os.read(fd, 65536)  # blocks: no polling
            except OSError:
                data = b""
            text = decoder.decode(data, final=not data)
            if is_stdout and text:
                text = self.command.preprocess_output(text, True)  # MLX strips its pidfile line here
            pending += text
            *lines, pending = pending.split("\n")
            for line in lines:
                self._out(is_stdout, tag(self.rank, line.rstrip("\r")))
            if not data:
                if pending:
                    self._out(is_stdout, tag(self.rank, pending.rstrip("\r")))
                return

    def _wait(self, events: queue.SimpleQueue) -> None:
        code = self.process.wait()
        for reader in self._readers:
            reader.join(2.0)
        self.returncode = code
        events.put(("exited", self.rank, code))

    def terminate(self) -> None:
        """MLX's terminate: SIGTERM to the local process (or ssh), then its kill script for the remote pid."""
        if self.returncode is not None:
            return
        try:
            self.command.terminate()
        except Exception as err:
            _say(f"rank {self.rank} ({self.host}): stop script failed: {err}")


class Pump:
    """Replaces `mlx._distributed_utils.launch._launch_with_io`; `code` is the group's exit code."""

    def __init__(self, events: queue.SimpleQueue) -> None:
        self.events = events
        self.ranks: list[Rank] = []
        self.code = EXIT_FAILED
        self._write_lock = threading.Lock()

    def out(self, is_stdout: bool, line: str) -> None:
        stream = sys.stdout if is_stdout else sys.stderr
        with self._write_lock:
            try:
                stream.write(line + "\n")
                stream.flush()
            except OSError:
                pass  # nobody reads (the daemon died): keep stopping the ranks

    def __call__(self, command_class: type, arguments: Sequence[tuple[tuple, dict]], verbose: bool = False) -> None:
        for args, kwargs in arguments:
            if self._stop_requested():
                break
            self.ranks.append(Rank(args[0], command_class(*args, **kwargs), self.out, self.events))
        reason = self._first_event() if len(self.ranks) == len(arguments) else ("stop", "signal")
        self._stop_all()
        self.code = self._exit_code(reason)

    def _stop_requested(self) -> bool:
        try:
            event = self.events.get_nowait()
        except queue.Empty:
            return False
        self.events.put(event)
        return event[0] == "stop"

    def _first_event(self) -> tuple:
        while True:
            event = self.events.get()
            if event[0] == "stop" or event[0] == "exited":
                return event

    def _exit_code(self, reason: tuple) -> int:
        if reason[0] == "stop":
            return EXIT_STOPPED
        _, rank, code = reason
        what = f"exited with code {code}" if code >= 0 else f"was killed by {_signal_name(-code)}"
        _say(f"rank {rank} ({self.ranks[rank].host}) {what}; the group stops with it")
        return EXIT_UNFIXABLE if code == EXIT_UNFIXABLE else EXIT_FAILED

    def _stop_all(self) -> None:
        stoppers = [_thread(r.terminate) for r in self.ranks if r.returncode is None]
        for rank in self.ranks:
            rank.done.join(STOP_GRACE_S)
        for stopper in stoppers:
            stopper.join(1.0)
        for rank in self.ranks:
            if rank.returncode is None:
                _say(f"rank {rank.rank} ({rank.host}) outlived SIGTERM by {STOP_GRACE_S:g}s: SIGKILL")
                with contextlib.suppress(OSError):
                    rank.process.kill()
                rank.done.join(5.0)


def watch_lifeline(fd: int, events: queue.SimpleQueue) -> None:
    """EOF on the daemon's pipe: stop like SIGTERM, and make sure nothing of the group survives."""
    lifeline.wait_eof(fd)
    events.put(("stop", "lifeline"))
    timer = threading.Timer(LIFELINE_HARD_S, os.killpg, args=(os.getpgrp(), signal.SIGKILL))
    timer.daemon = True
    timer.start()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lifeline_fd = None
    if argv[:1] == ["--lifeline-fd"]:
        lifeline_fd, argv = int(argv[1]), argv[2:]
    events: queue.SimpleQueue = queue.SimpleQueue()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: events.put(("stop", "signal")))
    if lifeline_fd is not None:
        _thread(watch_lifeline, lifeline_fd, events)
    from mlx._distributed_utils import launch  # imports mlx: after the lifeline is watched

    pump = Pump(events)
    launch._launch_with_io = pump  # the one seam into MLX's launcher (tested range: mlx 0.32.x)
    sys.argv = ["mlx.launch", *argv]
    try:
        launch.main()
    except SystemExit as exit_:  # MLX's argument errors: parser.error exits 2
        return exit_.code if isinstance(exit_.code, int) else EXIT_UNFIXABLE
    return pump.code


def _thread(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        print(f"veloxd launcher: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # reader threads may still block on a rank's pipe
