"""`make run`'s demo and the signals of a terminal: Ctrl-C stops the daemon, and so does closing
the terminal (SIGHUP), which the daemon alone would take as a reload and outlive the demo, and
so does a demo killed outright (SIGKILL), through the daemon's lifeline.

The demo runs as `make run` runs it (python -m veloxd.demo), with its log and state in a temporary
directory and one entry whose model directory does not exist yet: the daemon starts and waits,
no worker is spawned, so the demo is still waiting for READY when the signal comes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures.daemon_harness import pid_alive, wait_gone
from tests.support import REPO, free_port, wait_until

DEADLINE_S = 120


def start_demo(tmp_path: Path, ignore_hangup: bool = False, *extra: str) -> tuple[subprocess.Popen, Path]:
    config = tmp_path / "veloxd.yaml"
    missing = tmp_path / "not-yet-there"
    config.write_text(
        f"version: 1\nservers:\n  lonely:\n    model: {missing}\n    method: fp16\n    port: {free_port()}\n"
    )
    cache = tmp_path / "cache"
    argv = [sys.executable, "-m", "veloxd.demo", "--config", str(config), "--cache-dir", str(cache), *extra]

    def hangup_disposition() -> None:  # set either way: the test runner itself may run under nohup
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignore_hangup else signal.SIG_DFL)

    with open(tmp_path / "demo.out", "w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, preexec_fn=hangup_disposition)
    return proc, cache / "veloxd.jsonl"


def records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line] if log.exists() else []


def wait_record(log: Path, event: str, **match: Any) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        hits = [r for r in records(log) if r["event"] == event and all(r.get(k) == v for k, v in match.items())]
        return hits[0] if hits else None

    return wait_until(found, DEADLINE_S, interval=0.05, what=f"{event} {match} in {log}")


def stop(demo: subprocess.Popen, daemon: int | None) -> None:
    """After a failure too: neither the demo nor a daemon it left behind outlives the test."""
    if demo.poll() is None:
        demo.kill()
        demo.wait()
    if daemon is not None and pid_alive(daemon):
        os.kill(daemon, signal.SIGKILL)


def test_closing_the_terminal_stops_the_daemon_with_the_demo(tmp_path: Path) -> None:
    demo, log = start_demo(tmp_path)
    daemon = None
    try:
        daemon = wait_record(log, "daemon_started")["pid"]
        wait_record(log, "server_waiting", server="lonely")
        demo.send_signal(signal.SIGHUP)  # as the shell sends it to its jobs when the terminal closes
        assert demo.wait(DEADLINE_S) == 0
        stopping = wait_record(log, "daemon_stopping")
        assert stopping["signal"] == "SIGTERM"  # told to stop, not to reload
        wait_gone([daemon], DEADLINE_S)
    finally:
        stop(demo, daemon)


def test_under_nohup_the_demo_outlives_a_hangup_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    demo, log = start_demo(tmp_path, ignore_hangup=True)
    daemon = None
    try:
        daemon = wait_record(log, "daemon_started")["pid"]
        wait_record(log, "server_waiting", server="lonely")
        demo.send_signal(signal.SIGHUP)  # ignored, as nohup asks
        demo.send_signal(signal.SIGINT)
        assert demo.wait(DEADLINE_S) == 0
        assert wait_record(log, "daemon_stopping")["signal"] == "SIGINT"  # the hangup stopped nothing
        wait_gone([daemon], DEADLINE_S)
    finally:
        stop(demo, daemon)


def test_a_killed_demo_takes_its_daemon_along(tmp_path: Path) -> None:
    demo, log = start_demo(tmp_path)
    daemon = None
    try:
        daemon = wait_record(log, "daemon_started")["pid"]
        wait_record(log, "server_waiting", server="lonely")
        demo.kill()  # no handler runs: only the kernel closing the demo's end of the lifeline tells the daemon
        demo.wait(DEADLINE_S)
        wait_record(log, "daemon_wrapper_gone")
        assert wait_record(log, "daemon_stopping")["cause"] == "wrapper_gone"
        wait_gone([daemon], DEADLINE_S)
        assert wait_record(log, "daemon_stopped")["pid"] == daemon
    finally:
        stop(demo, daemon)


def test_a_demo_that_gives_up_waiting_says_which_server_waits_and_why(tmp_path: Path) -> None:
    # The entry's model never appears; the wait is long enough for the daemon to record why on a
    # busy machine (the daemon starts and writes its state within a second or two when idle).
    demo, log = start_demo(tmp_path, False, "--ready-timeout", "10")
    daemon = None
    try:
        daemon = wait_record(log, "daemon_started")["pid"]
        out = tmp_path / "demo.out"
        wait_until(lambda: "not all ready yet" in out.read_text(), DEADLINE_S, what="the demo's verdict")
        text = out.read_text()
        assert f"see {log}" in text, text
        assert f"  lonely: waiting: model path {tmp_path / 'not-yet-there'} does not exist (yet)" in text, text
        demo.send_signal(signal.SIGINT)
        assert demo.wait(DEADLINE_S) == 0
        wait_gone([daemon], DEADLINE_S)
    finally:
        stop(demo, daemon)
