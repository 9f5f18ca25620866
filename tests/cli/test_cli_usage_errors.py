"""Bad command lines get one line and exit 2, never a traceback; a subcommand's own mistakes are
reported with that subcommand's usage; every command's --help says what it does."""

from __future__ import annotations

from pathlib import Path

from tests.support import run_veloxd


def test_logs_refuses_a_negative_line_count_as_a_usage_error(tmp_path: Path) -> None:
    done = run_veloxd("logs", "-n", "-5", "--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith("usage: veloxd logs ")
    assert done.stderr.splitlines()[-1] == "veloxd logs: error: argument --lines/-n: must be 0 or more, got -5"


def test_logs_with_a_directory_for_log_file_says_so(tmp_path: Path) -> None:
    done = run_veloxd("logs", "--log-file", str(tmp_path), "--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == f"veloxd logs: {tmp_path} is a directory, not a log file (pass --log-file FILE)\n"


def test_run_with_an_unbalanced_worker_command_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    done = run_veloxd("run", "--worker-command", 'python "', "--state-dir", str(state_dir))
    assert done.returncode == 2
    assert done.stderr == "veloxd run: error: --worker-command 'python \"': No closing quotation\n"
    assert not state_dir.exists()


def test_an_unknown_option_is_reported_with_the_commands_own_usage() -> None:
    done = run_veloxd("check", "--bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: veloxd check ")
    assert done.stderr.splitlines()[-1] == "veloxd check: error: unrecognized arguments: --bogus"


def test_an_unknown_option_before_any_command_keeps_the_top_level_usage() -> None:
    done = run_veloxd("--bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: veloxd [-h]")
    assert done.stderr.splitlines()[-1] == "veloxd: error: unrecognized arguments: --bogus"


def test_uninstall_help_describes_what_it_does() -> None:
    done = run_veloxd("uninstall", "--help")
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())
    assert "Boot the job out of gui/$UID" in shown and "remove ~/Library/LaunchAgents/LABEL.plist" in shown


def test_status_with_a_state_file_cut_short_says_so_not_that_the_daemon_never_ran(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"schema_version": 1, "daem')
    done = run_veloxd("status", "--state-dir", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"veloxd status: the state file {tmp_path / 'state.json'} cannot be read as the daemon's state "
        "(not a JSON object: cut short, or another file)"
    )
    (tmp_path / "state.json").unlink()
    absent = run_veloxd("status", "--state-dir", str(tmp_path))
    assert absent.stderr.splitlines()[-1] == f"veloxd status: no state file in {tmp_path} (the daemon has not run)"
