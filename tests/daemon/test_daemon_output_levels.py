"""A worker's stderr line that carries a level (its log format, veloxd.protocol.WORKER_LOG_FORMAT,
or its own `veloxd serve: warning:` account) becomes a `server_output` record at that level;
every other line stays info. The event name and its keys do not change."""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.daemon_harness import FAKE_WORKER, DaemonHarness, entry
from tests.support import free_port
from veloxd import protocol

# Each line the wrapped worker writes on stderr before it starts, and the level it is logged at.
LINES = {
    "WARNING request_cancelled reason=client_disconnected completion_tokens=3 max_tokens=16": "warning",
    "ERROR generation thread died": "error",
    "CRITICAL out of memory": "error",
    "INFO max_tokens_capped requested=9 limit=4": "info",
    "DEBUG tokenizer loaded": "info",
    f"{protocol.WORKER_PREFIX}warning: method kivi does not batch": "warning",
    f"{protocol.WORKER_PREFIX}error: the model failed to load": "error",
    "2026-01-02 03:04:05,678 - WARNING - request_refused reason=prompt_too_long": "warning",  # a rank's format
    "WARNINGS are not a level": "info",
    "a traceback line mentioning ERROR in passing": "info",
}


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    h = DaemonHarness(tmp_path)
    yield h
    h.cleanup()


def test_worker_lines_are_logged_at_their_own_level(harness: DaemonHarness) -> None:
    h = harness
    # The stand-in worker, behind a shell that first writes LINES on stderr (the daemon appends
    # the entry's flags, which `exec "$0" "$@"` hands on).
    script = "".join(f"printf '%s\\n' {shlex.quote(line)} >&2; " for line in LINES) + 'exec "$0" "$@"'
    h.worker_command = shlex.join(["sh", "-c", script, sys.executable, str(FAKE_WORKER)])
    h.write({"alpha": entry(free_port())})
    h.start()
    h.wait_states({"alpha": "ready"})
    last = list(LINES)[-1]
    h.wait_event("server_output", server="alpha", line=last)

    logged = {r["line"]: r for r in h.events("server_output", server="alpha") if r["line"] in LINES}
    assert {line: record["level"] for line, record in logged.items()} == LINES
    pid = h.server("alpha")["pid"]
    for record in logged.values():
        assert set(record) == {"timestamp", "level", "event", "logger", "server", "pid", "stream", "line"}, record
        assert (record["pid"], record["stream"]) == (pid, "stderr")


@pytest.mark.parametrize(
    ("level", "expected"),
    [(logging.DEBUG, "info"), (logging.INFO, "info"), (logging.WARNING, "warning"), (logging.ERROR, "error")],
)
def test_the_workers_own_format_carries_the_level_the_daemon_reads(level: int, expected: str) -> None:
    """A line as the worker's logging writes it under the daemon, read back by the daemon's rule."""
    record = logging.LogRecord("mlx_lm", level, __file__, 1, "request_cancelled reason=%s", ("x",), None)
    assert protocol.line_level(logging.Formatter(protocol.WORKER_LOG_FORMAT).format(record)) == expected
