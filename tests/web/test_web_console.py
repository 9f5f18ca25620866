"""`veloxd run` on a terminal prints readable lines; the log file stays JSON; --log-format; logs --pretty.

The daemon runs under a real pseudo-terminal (pty), as it does when a person starts it.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.fixtures.daemon_harness import FAKE_WORKER, DaemonHarness, entry
from tests.support import REPO, free_port, veloxd_cmd, wait_until

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CONSOLE_LINE = re.compile(r"^\d\d:\d\d:\d\d \[(info|warning|error|debug)\s*\] (\w+)")


class Terminal:
    """`veloxd run` with its stdout and stderr on a pty; collects what a terminal would show."""

    def __init__(self, h: DaemonHarness, *extra: str, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        argv = veloxd_cmd(
            "run",
            "--config",
            str(h.config),
            "--log-file",
            str(h.log_file),
            "--state-dir",
            str(h.state_dir),
            "--worker-command",
            f"{sys.executable} {FAKE_WORKER}",
            *extra,
        )
        environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            env={**environ, "TERM": "xterm-256color", **(env or {})},
        )
        os.close(slave)
        self.buffer = b""
        self.closed = False

    def read(self) -> str:
        while not self.closed and select.select([self.master], [], [], 0.05)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            self.buffer += chunk
        return self.buffer.decode("utf-8", "replace").replace("\r\n", "\n")

    def wait_for(self, text: str, timeout: float = 60) -> str:
        return wait_until(
            lambda: self.read() if text in ANSI.sub("", self.read()) else None,
            timeout,
            interval=0.1,
            what=f"{text!r} on the terminal",
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.read()
        os.close(self.master)
        self.closed = True
        return code


def test_terminal_shows_readable_lines_and_the_file_stays_json(tmp_path: Path) -> None:
    """On a pty: one line per event with time, level, event and server, colored; no JSON object
    lines and no argv; the READY line's payload is cut short. The file has every key as JSON."""
    h = DaemonHarness(tmp_path)
    h.write({"alpha": entry(free_port(), method="kivi", bits=2)})
    term = Terminal(h)
    try:
        screen = term.wait_for("server_ready")
        assert term.stop() == 0
    finally:
        h.cleanup()
    screen = term.read()
    assert "\x1b[" in screen  # colors on a terminal
    lines = [ANSI.sub("", line) for line in screen.splitlines() if line.strip()]
    assert not [line for line in lines if line.lstrip().startswith("{")], lines
    events = [m.group(2) for line in lines if (m := CONSOLE_LINE.match(line))]
    assert events[:3] == ["daemon_started", "config_loaded", "server_starting"], lines
    assert {"server_ready", "daemon_stopped"} <= set(events)
    starting = next(line for line in lines if " server_starting " in line)
    assert "server=alpha" in starting and "method=kivi" in starting and "argv" not in starting
    ready = next(line for line in lines if " server_ready " in line)
    assert "bits=2" in ready and "kv_ratio=0.25" in ready and "ready=" not in ready
    assert "--lifeline-fd" not in screen  # the argv is logged once, at debug level only
    records = h.records()
    assert records and all(isinstance(r, dict) and r["timestamp"].endswith("Z") for r in records)
    file_ready = next(r for r in records if r["event"] == "server_ready")
    assert file_ready["ready"]["kv_bytes_per_token"]["ratio"] == 0.25  # the file keeps every key


def test_log_format_json_no_color_and_debug_level(tmp_path: Path) -> None:
    """--log-format json prints the file's JSON lines on the terminal; NO_COLOR turns colors off
    on a console; --log-level debug adds each worker's argv, once."""
    h = DaemonHarness(tmp_path)
    h.write({"alpha": entry(free_port())})
    term = Terminal(h, "--log-format", "json", "--log-level", "debug")
    try:
        term.wait_for('"server_ready"')
        assert term.stop() == 0
    finally:
        h.cleanup()
    shown = [json.loads(line) for line in term.read().splitlines() if line.startswith("{")]
    assert [r["event"] for r in shown][:2] == ["daemon_started", "config_loaded"]
    commands = [r for r in h.records() if r["event"] == "server_command_built"]
    assert len(commands) == 1 and commands[0]["level"] == "debug" and "--lifeline-fd" in commands[0]["argv"]

    h2 = DaemonHarness(tmp_path / "plain")
    h2.write({"alpha": entry(free_port())})
    term = Terminal(h2, "--log-format", "console", env={"NO_COLOR": "1"})
    try:
        term.wait_for("server_ready")
        assert term.stop() == 0
    finally:
        h2.cleanup()
    assert "\x1b[" not in term.read() and CONSOLE_LINE.match(term.read().splitlines()[0])
    assert not [r for r in h2.records() if r["event"] == "server_command_built"]  # info level: no argv


def test_no_terminal_means_no_stdout_and_logs_pretty_renders_the_file(tmp_path: Path) -> None:
    """Under launchd (stdout not a terminal) `auto` prints nothing; `veloxd logs --pretty` renders
    the JSON file as the console does, one server's lines with --server."""
    h = DaemonHarness(tmp_path)
    h.write({"alpha": entry(free_port()), "beta": entry(free_port())})
    try:
        h.start()
        h.wait_states({"alpha": "ready", "beta": "ready"})
        assert h.stop() == 0
    finally:
        h.cleanup()
    assert h.output.read_text() == ""
    pretty = subprocess.run(
        veloxd_cmd("logs", "--pretty", "--log-file", str(h.log_file)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
    )
    lines = pretty.stdout.splitlines()
    assert pretty.returncode == 0 and len(lines) == len(h.records())
    assert all(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[", line) for line in lines), lines
    only_beta = subprocess.run(
        veloxd_cmd("logs", "--pretty", "--server", "beta", "--log-file", str(h.log_file)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert only_beta.stdout and all("server=beta" in line for line in only_beta.stdout.splitlines())
