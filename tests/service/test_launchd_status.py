"""What `veloxd status` shows from launchd: parsing `launchctl print` / `print-disabled` output as macOS
prints it, the install decision table, and `launchd_status` against the stub launchctl on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.launchctl_print import running_job
from tests.fixtures.launchd_harness import LABEL, TARGET, LaunchdHarness
from veloxd.service import launchctl
from veloxd.service.agent import Step, plan_install
from veloxd.service.launchctl import format_status, parse_disabled, parse_print, status_from_print
from veloxd.service.runner import Result

RUNNING = running_job(501, LABEL, f"/Users/me/Library/LaunchAgents/{LABEL}.plist", runs=3, pid=4242)
CRASHED = f"""gui/501/{LABEL} = {{
\tpath = /Users/me/Library/LaunchAgents/{LABEL}.plist
\tstate = spawn scheduled
\truns = 7
\tlast exit code = 78: EX_CONFIG
\tlast terminating signal = Segmentation fault: 11
}}
"""
DISABLED = '\tdisabled services = {\n\t\t"com.apple.Siri.agent" => enabled\n\t\t"io.veloxd.daemon" => disabled\n\t}\n'
DISABLED_OLD = 'disabled services = {\n\t"io.veloxd.daemon" => true\n\t"io.veloxd.daemon.other" => false\n}\n'


def ok(stdout: str) -> Result:
    return Result(["launchctl", "print"], 0, stdout, "")


NOT_FOUND = Result(["launchctl", "print"], 113, "", f'Could not find service "{LABEL}" in domain for user gui: 501')


def test_parse_print_reads_top_level_fields_only() -> None:
    fields = parse_print(RUNNING)
    assert fields["state"] == "running"  # not the nested endpoint's "active"
    assert fields["pid"] == "4242"  # not the nested endpoint's 1
    assert fields["path"] == f"/Users/me/Library/LaunchAgents/{LABEL}.plist"
    assert "arguments" not in fields


def test_status_running_never_exited() -> None:
    status = status_from_print(ok(RUNNING), "", LABEL)
    assert status == {
        "label": LABEL, "loaded": True, "pid": 4242, "last_exit_status": None, "last_signal": None,
        "disabled": False, "raw_state": "running", "path": f"/Users/me/Library/LaunchAgents/{LABEL}.plist",
    }  # fmt: skip
    assert format_status(status) == f"launchd: {LABEL} loaded, state running, pid 4242"


def test_status_crash_looping_job() -> None:
    status = status_from_print(ok(CRASHED), "", LABEL)
    assert (status["pid"], status["last_exit_status"], status["raw_state"]) == (None, 78, "spawn scheduled")
    assert status["last_signal"] == "Segmentation fault: 11"
    assert format_status(status) == (
        f"launchd: {LABEL} loaded, state spawn scheduled, no pid, last exit 78, last signal Segmentation fault: 11"
    )


def test_status_not_loaded_and_disabled() -> None:
    status = status_from_print(NOT_FOUND, DISABLED, LABEL)
    assert status["loaded"] is False and status["disabled"] is True and status["pid"] is None
    line = format_status(status)
    assert line.startswith(f"launchd: {LABEL} not loaded; DISABLED: run `launchctl enable gui/")
    assert "Allow in the Background" in line
    assert (
        format_status(status_from_print(NOT_FOUND, "", LABEL))
        == f"launchd: {LABEL} not loaded (`veloxd install` loads it)"
    )
    assert format_status(None) == "launchd: not available (no launchctl on PATH)"


@pytest.mark.parametrize(
    ("text", "label", "disabled"),
    [
        (DISABLED, LABEL, True),
        (DISABLED_OLD, LABEL, True),  # macOS before 14 prints true/false
        (DISABLED_OLD, "io.veloxd.daemon.other", False),
        (DISABLED, "io.veloxd", False),  # a prefix of a disabled label is not that label
        ("", LABEL, False),
    ],
)
def test_parse_disabled(text: str, label: str, disabled: bool) -> None:
    assert parse_disabled(text, label) is disabled


def test_install_decision_table() -> None:
    assert plan_install(loaded=False, unchanged=False) is Step.BOOTSTRAP
    assert plan_install(loaded=False, unchanged=True) is Step.BOOTSTRAP
    assert plan_install(loaded=True, unchanged=True) is Step.KICKSTART
    assert plan_install(loaded=True, unchanged=False) is Step.REPLACE


@pytest.mark.parametrize(
    ("code", "stderr", "transient", "not_loaded"),
    [
        (5, "Bootstrap failed: 5: Input/output error", True, False),
        (37, "Bootstrap failed: 37: Operation already in progress", True, False),
        (1, "Bootstrap failed: 1: Operation not permitted", False, False),
        (119, "Bootstrap failed: 119: Service is disabled", False, False),
        (3, "Boot-out failed: 3: No such process", False, True),
        (113, 'Could not find service "x" in domain for user gui: 501', False, True),
    ],
)
def test_error_classification(code: int, stderr: str, transient: bool, not_loaded: bool) -> None:
    result = Result(["launchctl"], code, "", stderr)
    assert launchctl.is_transient_bootstrap_failure(result) is transient
    assert launchctl.is_not_loaded(result) is not_loaded


def test_launchd_status_through_the_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = LaunchdHarness(tmp_path)
    monkeypatch.setenv("PATH", h.env["PATH"])
    monkeypatch.setenv("LAUNCHD_STUB_DIR", str(h.state))
    status = launchctl.launchd_status(LABEL)
    assert status is not None and status["loaded"] is False and status["disabled"] is False

    assert h.install().returncode == 0
    h.mark("disabled", LABEL)
    status = launchctl.launchd_status(LABEL)
    assert status is not None
    assert status["loaded"] is True and status["pid"] == 4001 and status["raw_state"] == "running"
    assert status["disabled"] is True
    assert status["path"] == str(h.plist)
    assert h.calls()[-2:] == [f"launchctl print {TARGET}", f"launchctl print-disabled gui/{TARGET.split('/')[1]}"]

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert launchctl.launchd_status(LABEL) is None


def test_a_hung_launchctl_is_reported_not_waited_on_forever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "launchctl").write_text("#!/bin/sh\nexec sleep 30\n")
    (fake / "launchctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    result = launchctl.run("print", TARGET, timeout=0.5)
    assert result.returncode == 124 and "did not answer within" in result.text


def test_veloxd_status_reports_launchd_view_even_without_a_state_file(tmp_path: Path) -> None:
    """`veloxd status` shows what launchd knows (loaded, pid, disabled) next to the daemon's state."""
    h = LaunchdHarness(tmp_path)
    assert h.install().returncode == 0
    state_dir = tmp_path / "no-daemon-yet"
    result = h.run("status", "--state-dir", str(state_dir))
    assert result.returncode == 1  # no daemon state: the daemon has not run
    assert f"launchd: {LABEL} loaded" in result.stdout and "pid 4001" in result.stdout
    h.mark("disabled", LABEL)
    as_json = h.run("status", "--json", "--state-dir", str(state_dir))
    import json

    data = json.loads(as_json.stdout)
    assert data["launchd"]["loaded"] is True and data["launchd"]["disabled"] is True
    assert data["daemon_alive"] is False
    assert "DISABLED" in h.run("status", "--state-dir", str(state_dir)).stdout


def _hung_launchctl(tmp_path: Path) -> tuple[Path, Path]:
    """A launchctl that records its arguments, then never answers (exec: the timeout kills sleep itself)."""
    fake, calls = tmp_path / "hung-bin", tmp_path / "hung-calls.log"
    fake.mkdir()
    (fake / "launchctl").write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec sleep 600\n')
    (fake / "launchctl").chmod(0o755)
    return fake, calls


def test_a_hung_launchctl_is_reported_as_such_and_asked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = _hung_launchctl(tmp_path)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status = launchctl.launchd_status(LABEL, timeout=0.5)
    assert status is not None and status["loaded"] is None
    assert status["error"] == "launchctl print did not answer within 0.5 s"
    assert format_status(status) == f"launchd: {LABEL} unknown: launchctl print did not answer within 0.5 s"
    assert calls.read_text().splitlines() == [f"print {TARGET}"]  # print-disabled was not asked


def test_veloxd_status_with_a_hung_launchctl_does_not_say_not_loaded(tmp_path: Path) -> None:
    h = LaunchdHarness(tmp_path)
    fake, calls = _hung_launchctl(tmp_path)
    done = h.run("status", "--state-dir", str(tmp_path / "no-daemon"), PATH=f"{fake}:/usr/bin:/bin")
    assert done.returncode == 1  # no daemon state, as without launchd
    expected = f"launchctl print did not answer within {launchctl.STATUS_TIMEOUT_S:g} s"
    assert done.stdout.splitlines() == [f"launchd: {LABEL} unknown: {expected}"]
    assert "not loaded" not in done.stdout + done.stderr
    assert calls.read_text().splitlines() == [f"print {TARGET}"]


def test_a_hung_print_disabled_leaves_loaded_known_and_disabled_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (tmp_path / "print.txt").write_text(RUNNING)
    (fake / "launchctl").write_text(
        f'#!/bin/sh\n[ "$1" = print ] && exec cat "{tmp_path / "print.txt"}"\nexec sleep 600\n'
    )
    (fake / "launchctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    status = launchctl.launchd_status(LABEL, timeout=0.5)
    assert status is not None and status["loaded"] is True and status["pid"] == 4242
    assert format_status(status) == (
        f"launchd: {LABEL} loaded, state running, pid 4242; whether it is disabled is unknown: "
        "launchctl print-disabled did not answer within 0.5 s"
    )
