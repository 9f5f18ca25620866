"""`veloxd reload`, `restart` and `logs`: their --help shows their exit-code table
(veloxd/cli/daemon_help.py), and each row of it is brought about, with a real daemon in front of
stand-in workers or with none, and gives its code."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import free_port, run_veloxd
from veloxd.cli.daemon_help import EXIT_FAILED, EXIT_OK, EXIT_USAGE, TABLES, description


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    h = DaemonHarness(tmp_path)
    yield h
    h.cleanup()


def _words(text: str) -> str:
    return " ".join(text.split())  # argparse re-wraps a description


@pytest.mark.parametrize("command", sorted(TABLES))
def test_help_describes_the_command_and_lists_every_exit_code(command: str) -> None:
    done = run_veloxd(command, "--help")
    shown = _words(done.stdout)
    assert done.returncode == 0, done.stderr
    assert _words(description(command)) in shown, shown
    assert all(f"{code}: " in shown for code, _ in TABLES[command]), shown


def test_the_tables_cover_ok_failure_and_usage() -> None:
    for command, rows in TABLES.items():
        assert [code for code, _ in rows] == [EXIT_OK, EXIT_FAILED, EXIT_USAGE], command


def test_without_a_daemon_reload_and_restart_exit_1_and_logs_without_its_file_too(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path))
    for args in (("reload",), ("restart", "alpha")):
        done = run_veloxd(*args, *state)
        assert done.returncode == EXIT_FAILED and "no veloxd daemon is listening" in done.stderr, (args, done.stderr)
    done = run_veloxd("logs", "--log-file", str(tmp_path / "none.jsonl"), *state)
    assert done.returncode == EXIT_FAILED and "does not exist" in done.stderr, done.stderr


@pytest.mark.parametrize("args", [("reload", "--bogus"), ("restart",), ("logs", "--lines", "many")])
def test_a_bad_command_line_exits_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = run_veloxd(*args, "--state-dir", str(tmp_path))
    assert done.returncode == EXIT_USAGE and "usage: veloxd" in done.stderr, done.stderr


def test_each_code_with_a_running_daemon(harness: DaemonHarness) -> None:
    h = harness
    h.write({"alpha": entry(free_port())})
    h.start()
    h.wait_states({"alpha": "ready"})

    done = h.cli("reload")
    assert (done.returncode, done.stdout.strip()) == (EXIT_OK, "config unchanged since the last reload: nothing to do")
    done = h.cli("restart", "nobody")
    assert done.returncode == EXIT_FAILED and "no server named 'nobody' (servers: alpha)" in done.stderr
    mark = h.mark()
    done = h.cli("restart", "alpha")
    assert (done.returncode, done.stdout.strip()) == (EXIT_OK, "restarting alpha")
    h.wait_event("server_restart_requested", after=mark, server="alpha")
    done = h.cli("logs", "--log-file", str(h.log_file))
    assert done.returncode == EXIT_OK and '"event": "server_restart_requested"' in done.stdout
    done = h.cli("logs", "--log-file", str(h.log_file), "--server", "nobody")
    assert (done.returncode, done.stdout) == (EXIT_OK, "") and "no lines for server 'nobody'" in done.stderr

    h.write("version: 1\nservers: {alpha: {port: nope}}\n")
    done = h.cli("reload")
    assert done.returncode == EXIT_FAILED, done.stderr
    assert "every server keeps running on the last good one" in done.stderr


def test_reload_and_restart_exit_1_while_the_daemon_stops(harness: DaemonHarness) -> None:
    h = harness
    # The worker ignores SIGTERM: the daemon stays stopping until stop_timeout_s, long past the asks.
    h.write({"alpha": entry(free_port(), stop_timeout_s=120, env={"FAKE_IGNORE_TERM": "1"})})
    h.start()
    h.wait_states({"alpha": "ready"})
    h.signal(signal.SIGTERM)
    h.wait_event("daemon_stopping")
    for args in (("reload",), ("restart", "alpha")):
        done = h.cli(*args)
        assert done.returncode == EXIT_FAILED and "the daemon is stopping" in done.stderr, (args, done.stderr)
