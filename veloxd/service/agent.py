"""Install and uninstall the LaunchAgent: ask launchd what is loaded, decide (a pure function), then run
the launchctl steps in order. Each returns the one line that says what it did, or raises InstallFailed."""

from __future__ import annotations

import enum
import os
import plistlib
from pathlib import Path

from veloxd.files import read_or_none, write_atomic
from veloxd.service import launchctl
from veloxd.service.plist import plist_bytes
from veloxd.service.runner import InstallFailed
from veloxd.service.spec import STOP_MARGIN_S, AgentSpec

DEADLINE_ENV = "VELOXD_BOOTSTRAP_DEADLINE_S"  # tests shorten the EIO retry window; users never need it
UNLOAD_FALLBACK_S = 60.0  # how long to wait for an unload when the old plist gives no ExitTimeOut


class Step(enum.Enum):
    BOOTSTRAP = "bootstrap"  # not loaded: load it
    KICKSTART = "kickstart"  # loaded from this very plist: restart the process only
    REPLACE = "replace"  # loaded from another plist: bootout, then bootstrap the new one


def plan_install(loaded: bool, unchanged: bool) -> Step:
    if not loaded:
        return Step.BOOTSTRAP
    return Step.KICKSTART if unchanged else Step.REPLACE


def plist_path(label: str, home: str) -> Path:
    return Path(home) / "Library" / "LaunchAgents" / f"{label}.plist"


def bootstrap_deadline_s() -> float:
    return float(os.environ.get(DEADLINE_ENV) or launchctl.BOOTSTRAP_DEADLINE_S)


def _exit_timeout_of(data: bytes | None) -> float:
    try:
        return float(plistlib.loads(data)["ExitTimeOut"]) if data else UNLOAD_FALLBACK_S
    except Exception:  # a hand-edited or foreign plist: wait the generous default
        return UNLOAD_FALLBACK_S


def install(spec: AgentSpec) -> str:
    label, target = spec.label, launchctl.service_target(spec.label)
    path = plist_path(label, spec.home)
    new, old = plist_bytes(spec), read_or_none(path)
    printed = launchctl.print_service(label)
    if not printed.ok and not launchctl.is_not_loaded(printed):
        launchctl.fail(printed)
    loaded_from = launchctl.parse_print(printed.stdout).get("path") if printed.ok else None
    step = plan_install(printed.ok, unchanged=old == new and loaded_from in (None, str(path)))

    if step is Step.KICKSTART:
        kicked = launchctl.kickstart(label)
        if kicked.ok:
            return f"restarted {label}: plist unchanged, `launchctl kickstart -k {target}`"
        if not launchctl.is_not_loaded(kicked):
            launchctl.fail(kicked)
        step = Step.BOOTSTRAP  # unloaded between print and kickstart

    done = []
    if step is Step.REPLACE:
        _bootout_and_wait(label, _exit_timeout_of(old))
        done.append("booted out the old job")
    if old != new:
        write_atomic(path, new)
        done.append(f"wrote {path}")
    launchctl.check(launchctl.enable(label))
    result, retries = launchctl.bootstrap_with_retry(str(path), bootstrap_deadline_s())
    launchctl.check(result)
    retried = f" (after {retries} {'retry' if retries == 1 else 'retries'})" if retries else ""
    done.append(f"bootstrapped {path.name} into {launchctl.domain()}{retried}")
    verb = "reinstalled" if step is Step.REPLACE else "installed"
    return f"{verb} {label}: " + ", ".join(done)


def _bootout_and_wait(label: str, exit_timeout_s: float) -> bool:
    """Boot the job out and wait until launchd has let go of it (the daemon may take its whole
    ExitTimeOut to stop its servers). True if it was loaded, False if it was not (fine too)."""
    result = launchctl.bootout(label, timeout=exit_timeout_s + STOP_MARGIN_S)
    if launchctl.is_not_loaded(result):
        return False
    launchctl.check(result)
    if not launchctl.wait_until_unloaded(label, deadline_s=exit_timeout_s + STOP_MARGIN_S):
        raise InstallFailed(
            f"launchd still lists {launchctl.service_target(label)} {exit_timeout_s + STOP_MARGIN_S:g} s after "
            f"`launchctl bootout`; see `launchctl print {launchctl.service_target(label)}`"
        )
    return True


def uninstall(label: str, home: str) -> str:
    path = plist_path(label, home)
    existing = read_or_none(path)
    booted = _bootout_and_wait(label, _exit_timeout_of(existing))
    if existing is not None:
        path.unlink(missing_ok=True)
    if booted and existing is not None:
        return f"uninstalled {label}: booted out of {launchctl.domain()}, removed {path}"
    if booted:
        return f"uninstalled {label}: booted out of {launchctl.domain()} (there was no {path})"
    if existing is not None:
        return f"uninstalled {label}: it was not loaded, removed {path}"
    return f"nothing to uninstall: {label} is not loaded and {path} does not exist"
