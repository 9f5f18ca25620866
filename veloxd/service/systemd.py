"""Install and uninstall the systemd user unit with `systemctl --user` (argv lists, never a shell)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from veloxd.files import read_or_none, write_atomic
from veloxd.service.runner import COMMAND_TIMEOUT_S, CommandError, Result, run_tool
from veloxd.service.spec import AgentSpec
from veloxd.service.unit import render_unit, unit_name, unit_path


def available() -> bool:
    return shutil.which("systemctl") is not None


def config_home() -> str:
    """$XDG_CONFIG_HOME, else ~/.config (the systemd user manager reads units from there)."""
    return os.path.abspath(os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config"))


def systemctl(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> Result:
    return run_tool(["systemctl", "--user", *args], timeout=timeout)


def _check(result: Result) -> Result:
    if not result.ok:
        raise CommandError(result)
    return result


def install(spec: AgentSpec, name: str) -> str:
    unit, path = unit_name(name), Path(unit_path(config_home(), name))
    text = render_unit(spec).encode()
    changed = read_or_none(path) != text
    if changed:
        write_atomic(path, text)
    _check(systemctl("daemon-reload"))
    wrote = f"wrote {path}" if changed else f"{path} unchanged"
    if systemctl("is-active", "--quiet", unit).ok:
        _check(systemctl("enable", unit))
        _check(systemctl("restart", unit, timeout=spec.stop_grace_s + COMMAND_TIMEOUT_S))
        return f"restarted {unit}: {wrote}, then systemctl --user daemon-reload, enable and restart"
    _check(systemctl("enable", "--now", unit))
    return f"installed {unit}: {wrote}, then systemctl --user daemon-reload and enable --now"


def uninstall(name: str) -> str:
    unit, path = unit_name(name), Path(unit_path(config_home(), name))
    existing = read_or_none(path)
    if existing is None:
        return f"nothing to uninstall: {path} does not exist"
    grace = re.search(rb"^TimeoutStopSec=(\d+)", existing, re.MULTILINE)
    stop_s = int(grace.group(1)) if grace else COMMAND_TIMEOUT_S * 3
    _check(systemctl("disable", "--now", unit, timeout=stop_s + COMMAND_TIMEOUT_S))
    path.unlink(missing_ok=True)
    _check(systemctl("daemon-reload"))
    return f"uninstalled {unit}: stopped and disabled it, removed {path}"
