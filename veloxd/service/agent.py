"""Install and uninstall the LaunchAgent: ask launchd what is loaded, decide (a pure function), then run
the launchctl steps in order. Each returns the one line that says what it did, or raises InstallFailed."""

from __future__ import annotations

import enum
import os
import plistlib
from pathlib import Path

from veloxd.files import read_or_none, write_atomic
from veloxd.service import launchctl
from veloxd.service.pathcheck import os_problem
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
    new, old = plist_bytes(spec), _read_plist(path)
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

    done = _replace_plist(label, path, old, new, step)
    launchctl.check(launchctl.enable(label))
    result, retries = launchctl.bootstrap_with_retry(str(path), bootstrap_deadline_s())
    launchctl.check(result)
    retried = f" (after {retries} {'retry' if retries == 1 else 'retries'})" if retries else ""
    done.append(f"bootstrapped {path.name} into {launchctl.domain()}{retried}")
    verb = "reinstalled" if step is Step.REPLACE else "installed"
    return f"{verb} {label}: " + ", ".join(done)


def _replace_plist(label: str, path: Path, old: bytes | None, new: bytes, step: Step) -> list[str]:
    """Boot the old job out (REPLACE) and put the new plist in place; what was done, for the report.
    The new plist is written beside its final name first: whatever keeps it from being written (a
    parent that is a file, no permission) then stops the install while the old job still runs."""
    staged = _stage(path, new) if old != new else None
    done = []
    if step is Step.REPLACE:
        try:
            _bootout_and_wait(label, _exit_timeout_of(old))
        except BaseException:
            if staged is not None:
                staged.unlink(missing_ok=True)
            raise
        done.append("booted out the old job")
    if staged is not None:
        _commit(staged, path)
        done.append(f"wrote {path}")
    return done


def _read_plist(path: Path) -> bytes | None:
    """The installed plist, or None when there is none. One that cannot be read (a directory in its
    place, a parent that is a file) stops install and uninstall before launchd is asked anything."""
    try:
        return read_or_none(path)
    except OSError as err:
        raise InstallFailed(f"cannot read {path}: {os_problem(err, path)}") from None


def _stage(path: Path, data: bytes) -> Path:
    # Same directory: the rename into place cannot cross devices. Not named *.plist: launchd never
    # loads a leftover (an install killed midway) at the next login.
    staged = path.with_name(f".{path.name}.new")
    try:
        write_atomic(staged, data)
    except OSError as err:
        raise InstallFailed(f"cannot write {path}: {os_problem(err, staged)}; nothing was changed") from None
    return staged


def _commit(staged: Path, path: Path) -> None:
    try:
        os.replace(staged, path)
    except OSError as err:  # the directory changed under us since the staged write
        staged.unlink(missing_ok=True)
        raise InstallFailed(f"cannot write {path}: {os_problem(err, path)}") from None


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
    existing = _read_plist(path)
    if existing is not None:
        _check_removable(path)  # before the bootout: a plist left behind loads the job again at login
    booted = _bootout_and_wait(label, _exit_timeout_of(existing))
    if existing is not None:
        _remove(path, label if booted else None)
    if booted and existing is not None:
        return f"uninstalled {label}: booted out of {launchctl.domain()}, removed {path}"
    if booted:
        return f"uninstalled {label}: booted out of {launchctl.domain()} (there was no {path})"
    if existing is not None:
        return f"uninstalled {label}: it was not loaded, removed {path}"
    return f"nothing to uninstall: {label} is not loaded and {path} does not exist"


def _check_removable(path: Path) -> None:
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise InstallFailed(f"cannot remove {path}: no write permission on {path.parent}; nothing was changed")


def _remove(path: Path, booted_label: str | None) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as err:  # what os.access cannot see: an immutable flag, a sticky directory
        booted = f"booted out {booted_label}, but " if booted_label else ""
        raise InstallFailed(
            f"{booted}cannot remove {path}: {os_problem(err, path)}; remove it by hand, or launchd loads it at the next login"
        ) from None
