"""Run a service-manager tool (launchctl, systemctl) with an argv list and a timeout; keep its own words."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass

COMMAND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False  # killed at its timeout: it said nothing, so nothing may be read into its exit code

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        """The tool's own message, which is what the user sees when it fails."""
        return (self.stderr.strip() or self.stdout.strip()) or f"{self.argv[0]} exited with {self.returncode}"


class InstallFailed(RuntimeError):
    """The service manager refused or did not finish a step; the message is for the user."""


class CommandError(InstallFailed):
    def __init__(self, result: Result, hint: str = "") -> None:
        message = f"`{shlex.join(result.argv)}` failed (exit {result.returncode}): {result.text}"
        super().__init__(f"{message}\n{hint}" if hint else message)
        self.result = result


def run_tool(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> Result:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Result(argv, 124, "", f"{argv[0]} {argv[1]} did not answer within {timeout:g} s", timed_out=True)
    except OSError as err:  # vanished from PATH between the check and the call, or not executable
        return Result(argv, 127, "", f"cannot run {argv[0]}: {err.strerror or err}")
    return Result(argv, done.returncode, done.stdout, done.stderr)
