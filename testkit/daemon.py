"""The `veloxd run` command line that tests and benchmarks start a daemon with."""

from __future__ import annotations

import sys
from pathlib import Path


def daemon_argv(config: Path, log_file: Path, state_dir: Path, *extra: str) -> list[str]:
    """`veloxd run` on `config`, with its JSON log and state directory where the caller reads them."""
    argv = [sys.executable, "-m", "veloxd", "run", "--config", str(config), "--log-file", str(log_file)]
    return [*argv, "--state-dir", str(state_dir), *extra]
