"""What the service manager runs: one `AgentSpec` (pure data) from which the plist and the unit are rendered.

Every fact shared by launchd and systemd (the command line, the environment, how long a clean
stop may take) is derived here once, so the two renderings cannot disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

DEFAULT_LABEL = "io.veloxd.daemon"
DEFAULT_UNIT = "veloxd"
# launchd's own floor for respawning a job; also the systemd RestartSec, so both behave alike.
THROTTLE_INTERVAL_S = 10
# Beyond the slowest server's stop_timeout_s: the daemon stops servers in parallel, then reaps and
# flushes its log, so a fixed margin covers its own teardown.
STOP_MARGIN_S = 10
# launchd starts agents with PATH=/usr/bin:/bin:/usr/sbin:/sbin; Homebrew tools live in /opt/homebrew/bin.
SYSTEM_PATH = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/opt/homebrew/bin")
# Variables copied from the installing shell when set: where Hugging Face models are cached.
FORWARDED_ENV = ("HF_HOME", "HF_HUB_CACHE")
STDOUT_NAME = "launchd.stdout.log"
STDERR_NAME = "launchd.stderr.log"
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # also a file name: no '/', no spaces


def check_label(label: str) -> str:
    """The label names a file and a launchd service; refuse anything that is not a plain dotted name."""
    if not LABEL_PATTERN.match(label):
        raise ValueError(f"invalid label {label!r}: use letters, digits, '.', '_' and '-' (e.g. {DEFAULT_LABEL})")
    return label


@dataclass(frozen=True)
class AgentSpec:
    """Everything the daemon needs to start outside a shell; all paths absolute strings."""

    label: str
    python: str  # the venv's bin/python itself, not the base interpreter it links to
    config: str
    log_file: str
    state_dir: str
    home: str
    working_dir: str
    max_stop_timeout_s: float
    extra_env: Mapping[str, str] = field(default_factory=dict)  # HF_HOME, HF_HUB_CACHE, PYTHONPATH

    def __post_init__(self) -> None:
        check_label(self.label)
        for name in ("python", "config", "log_file", "state_dir", "home", "working_dir"):
            value = getattr(self, name)
            if not PurePosixPath(value).is_absolute() or "~" in value:
                raise ValueError(f"{name} must be an absolute path without '~', got {value!r}")
        if self.max_stop_timeout_s <= 0:
            raise ValueError(f"max_stop_timeout_s must be positive, got {self.max_stop_timeout_s}")

    @property
    def program_arguments(self) -> list[str]:
        return [
            self.python, "-P", "-m", "veloxd", "run",  # -P: a `veloxd` folder in the working directory cannot shadow it
            "--config", self.config,
            "--log-file", self.log_file,
            "--state-dir", self.state_dir,
        ]  # fmt: skip

    @property
    def venv_bin(self) -> str:
        return str(PurePosixPath(self.python).parent)

    @property
    def environment(self) -> dict[str, str]:
        env = {
            "PATH": ":".join(dict.fromkeys((self.venv_bin, *SYSTEM_PATH))),
            "HOME": self.home,
            "PYTHONUNBUFFERED": "1",
        }
        env.update(self.extra_env)
        return env

    @property
    def stop_grace_s(self) -> int:
        """launchd ExitTimeOut / systemd TimeoutStopSec: never SIGKILL the daemon mid-shutdown."""
        return math.ceil(self.max_stop_timeout_s) + STOP_MARGIN_S

    @property
    def stdout_path(self) -> str:
        return str(PurePosixPath(self.log_file).parent / STDOUT_NAME)

    @property
    def stderr_path(self) -> str:
        return str(PurePosixPath(self.log_file).parent / STDERR_NAME)

    @property
    def paths(self) -> dict[str, str]:
        """Every path the service manager touches, by role (the tests check each is absolute and exists)."""
        return {
            "python": self.python,
            "config": self.config,
            "log_dir": str(PurePosixPath(self.log_file).parent),
            "state_dir": self.state_dir,
            "working_dir": self.working_dir,
            "home": self.home,
        }
