"""Install and uninstall the systemd user unit with `systemctl --user` (argv lists, never a shell)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from veloxd.files import read_or_none, write_atomic
from veloxd.service.pathcheck import os_problem
from veloxd.service.runner import COMMAND_TIMEOUT_S, CommandError, InstallFailed, Result, run_tool
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


def _read_unit(path: Path) -> bytes | None:
    try:
        return read_or_none(path)
    except OSError as err:  # a directory in its place, a parent that is a file
        raise InstallFailed(f"cannot read {path}: {os_problem(err, path)}") from None


def install(spec: AgentSpec, name: str) -> str:
    unit, path = unit_name(name), Path(unit_path(config_home(), name))
    text = render_unit(spec).encode()
    changed = _read_unit(path) != text
    if changed:
        try:
            write_atomic(path, text)
        except OSError as err:  # before systemd is asked anything: a running unit keeps running
            raise InstallFailed(f"cannot write {path}: {os_problem(err, path)}; nothing was changed") from None
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
    existing = _read_unit(path)
    if existing is None:
        return f"nothing to uninstall: {path} does not exist"
    if not os.access(path.parent, os.W_OK | os.X_OK):  # before the stop: a unit left behind starts again
        raise InstallFailed(f"cannot remove {path}: no write permission on {path.parent}; nothing was changed")
    grace = re.search(rb"^TimeoutStopSec=(\d+)", existing, re.MULTILINE)
    stop_s = int(grace.group(1)) if grace else COMMAND_TIMEOUT_S * 3
    _check(systemctl("disable", "--now", unit, timeout=stop_s + COMMAND_TIMEOUT_S))
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise InstallFailed(
            f"stopped and disabled {unit}, but cannot remove {path}: {os_problem(err, path)}; remove it by hand"
        ) from None
    _check(systemctl("daemon-reload"))
    return f"uninstalled {unit}: stopped and disabled it, removed {path}"
