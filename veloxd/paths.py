"""Default locations of veloxd's files, per platform (one place, so every command agrees)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CONFIG_DEFAULT = "$VELOXD_CONFIG, else ~/.config/veloxd/veloxd.yaml"  # what default_config_path picks, for help texts


def default_config_path() -> Path:
    """$VELOXD_CONFIG, else ~/.config/veloxd/veloxd.yaml."""
    env = os.environ.get("VELOXD_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".config" / "veloxd" / "veloxd.yaml"


def _state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def default_log_file() -> Path:
    """~/Library/Logs/veloxd/veloxd.jsonl on macOS, $XDG_STATE_HOME/veloxd/veloxd.jsonl elsewhere."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Logs" / "veloxd" / "veloxd.jsonl"
    return _state_home() / "veloxd" / "veloxd.jsonl"


def default_state_dir() -> Path:
    """Where the daemon keeps its state file (pids, states, last reload)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "veloxd"
    return _state_home() / "veloxd"
