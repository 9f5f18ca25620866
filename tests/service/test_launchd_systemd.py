"""`veloxd install --systemd` / `uninstall --systemd` against a stub systemctl: the unit's content,
the exact `systemctl --user` sequences, XDG_CONFIG_HOME, and systemctl's own error text."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from tests.fixtures.launchd_harness import LaunchdHarness

UNIT = "veloxd.service"


def unit_file(h: LaunchdHarness) -> Path:
    return h.home / ".config" / "systemd" / "user" / UNIT


def install(h: LaunchdHarness, *verbs: str) -> str:
    """`veloxd install --systemd` succeeds after daemon-reload, is-active and these systemctl verbs
    on the unit, in order; returns what it printed."""
    done = h.install("--systemd")
    assert done.returncode == 0, done.stderr
    checks = ["systemctl --user daemon-reload", f"systemctl --user is-active --quiet {UNIT}"]
    assert h.calls() == [*checks, *(f"systemctl --user {verb} {UNIT}" for verb in verbs)]
    return done.stdout


def directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_install_writes_the_unit_and_enables_it_now_then_restarts_when_active(h: LaunchdHarness) -> None:
    printed = install(h, "enable --now")
    path = unit_file(h)
    assert printed == f"installed {UNIT}: wrote {path}, then systemctl --user daemon-reload and enable --now\n"
    unit = directives(path.read_text())
    assert unit["Restart"] == ["on-failure"]
    assert unit["RestartSec"] == ["10"]
    assert unit["KillMode"] == ["mixed"]
    assert unit["LimitNOFILE"] == ["8192"]  # the gateway's clients each hold a descriptor
    assert unit["TimeoutStopSec"] == ["40"]  # 30 s default stop_timeout_s + 10 s margin
    assert unit["WantedBy"] == ["default.target"]
    assert unit["WorkingDirectory"] == [str(h.config.parent)]
    argv = shlex.split(unit["ExecStart"][0])
    assert argv[0] == os.path.abspath(sys.executable)
    assert argv[1:7] == ["-P", "-m", "veloxd", "run", "--config", str(h.config)]
    for path_arg in (argv[0], argv[6], argv[8], argv[10]):
        assert os.path.isabs(path_arg)
    env = dict(shlex.split(line)[0].split("=", 1) for line in unit["Environment"])
    assert env["HOME"] == str(h.home) and env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].startswith(os.path.dirname(argv[0]) + ":")

    printed = install(h, "enable", "restart")
    assert printed == f"restarted {UNIT}: {path} unchanged, then systemctl --user daemon-reload, enable and restart\n"


def test_xdg_config_home_is_respected(h: LaunchdHarness) -> None:
    xdg = h.root / "xdg"
    done = h.install("--systemd", XDG_CONFIG_HOME=str(xdg))
    assert done.returncode == 0, done.stderr
    assert (xdg / "systemd" / "user" / UNIT).is_file()
    assert not unit_file(h).exists()


def test_paths_with_spaces_and_percent_survive_quoting(tmp_path: Path) -> None:
    h = LaunchdHarness(tmp_path)
    odd = h.root / "my 100% configs" / "veloxd.yaml"
    odd.parent.mkdir()
    odd.write_text(h.config.read_text())
    odd.chmod(0o600)
    done = h.run("install", "--systemd", "--print", "--config", str(odd))
    assert done.returncode == 0, done.stderr
    unit = directives(done.stdout)
    argv = shlex.split(unit["ExecStart"][0].replace("%%", "%"))  # systemd unescapes %% to %
    assert argv[6] == str(odd)  # after -P -m veloxd run --config
    assert unit["WorkingDirectory"] == [str(odd.parent).replace("%", "%%")]


def test_uninstall_disables_removes_and_is_fine_twice(h: LaunchdHarness) -> None:
    assert h.install("--systemd").returncode == 0
    h.calls()
    done = h.run("uninstall", "--systemd")
    assert done.returncode == 0, done.stderr
    assert h.calls() == [f"systemctl --user disable --now {UNIT}", "systemctl --user daemon-reload"]
    assert done.stdout == f"uninstalled {UNIT}: stopped and disabled it, removed {unit_file(h)}\n"
    assert not unit_file(h).exists()
    assert not h.is_marked("active", UNIT) and not h.is_marked("enabled", UNIT)

    twice = h.run("uninstall", "--systemd")
    assert twice.returncode == 0, twice.stderr
    assert h.calls() == []
    assert twice.stdout == f"nothing to uninstall: {unit_file(h)} does not exist\n"


def test_systemctl_failure_shows_its_text_and_exits_nonzero(h: LaunchdHarness) -> None:
    h.fail("systemctl", "daemon-reload", 1, "Failed to connect to bus: No medium found")
    done = h.install("--systemd")
    assert done.returncode == 1
    assert "Failed to connect to bus: No medium found" in done.stderr
    assert h.calls() == ["systemctl --user daemon-reload"]


def test_print_writes_nothing_and_calls_nothing(h: LaunchdHarness) -> None:
    done = h.install("--systemd", "--print")
    assert done.returncode == 0, done.stderr
    assert "KillMode=mixed" in done.stdout and "Restart=on-failure" in done.stdout
    assert not (h.home / ".config").exists()
    assert h.calls() == []


def test_a_unit_path_that_cannot_be_written_or_read_is_one_line_before_systemctl(h: LaunchdHarness) -> None:
    """A file where ~/.config/systemd/user should be (a directory) stops install and uninstall with
    one line naming it, and systemctl is never asked anything (a running unit keeps running)."""
    user_dir = unit_file(h).parent
    user_dir.parent.mkdir(parents=True, exist_ok=True)
    user_dir.write_text("not a directory\n")
    for done in (h.install("--systemd"), h.run("uninstall", "--systemd")):
        assert done.returncode == 1, done.stderr
        assert f"{user_dir} is not a directory" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert h.calls() == []
