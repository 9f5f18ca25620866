"""`veloxd install` and `veloxd uninstall` without their service manager: the hint names the
command being run, so it can be pasted as is. PATH holds no launchctl or systemctl here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import run_veloxd


@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_without_launchctl_the_hint_names_the_same_command(tmp_path: Path, command: str) -> None:
    done = run_veloxd(command, env={**os.environ, "PATH": str(tmp_path)})  # an empty directory: no launchctl
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"veloxd {command}: launchctl not found on PATH: this is not macOS (on Linux, use `veloxd {command} --systemd`)"
    )


@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_without_systemctl_the_refusal_names_the_command(tmp_path: Path, command: str) -> None:
    done = run_veloxd(command, "--systemd", env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"veloxd {command}: systemctl not found on PATH: --systemd needs a systemd user session"
    )
