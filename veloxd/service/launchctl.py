"""Talk to launchd through `launchctl` (argv lists, never a shell) and read what it says.

`launchctl print` output is not a stable API, so parsing is tolerant: unknown lines are ignored
and a missing field is None, never a guess.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from typing import Any, NoReturn

from veloxd.service.runner import COMMAND_TIMEOUT_S, CommandError, Result, run_tool

# Exit codes launchctl uses for "that service is not loaded" (bootout: 3 ESRCH; print/kickstart: 113).
NOT_LOADED_CODES = frozenset({3, 113})
NOT_LOADED_TEXT = ("No such process", "Could not find service", "not find specified service")
# Right after a bootout, launchd keeps the label for a few seconds: bootstrap then fails with
# 5 (EIO) or 37 (EALREADY, "Operation already in progress"). Retrying rides that window out.
TRANSIENT_BOOTSTRAP_CODES = frozenset({5, 37})
TRANSIENT_BOOTSTRAP_TEXT = ("Input/output error", "Operation already in progress")
BOOTSTRAP_DEADLINE_S = 15.0
RETRY_INTERVAL_S = 0.25
# `veloxd status` asks launchd once, for a report: a launchctl that takes longer is hung, and saying so
# beats waiting out COMMAND_TIMEOUT_S (meant for bootout and bootstrap, which do real work).
STATUS_TIMEOUT_S = 5.0


def available() -> bool:
    return shutil.which("launchctl") is not None


def domain() -> str:
    return f"gui/{os.getuid()}"


def service_target(label: str) -> str:
    return f"{domain()}/{label}"


def run(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> Result:
    return run_tool(["launchctl", *args], timeout=timeout)


def fail(result: Result) -> NoReturn:
    """Raise CommandError with launchctl's own text, plus a hint for the failures users actually hit."""
    raise CommandError(result, _hint(result))


def _hint(result: Result) -> str:
    """What to look at next; each verb fails for its own reasons, so the hint depends on the verb."""
    verb, operand = (result.argv[1:3] + ["", ""])[:2]  # ["launchctl", verb, target or domain, ...]
    if verb == "bootstrap" and (is_transient_bootstrap_failure(result) or result.returncode == 119):
        return (
            f"If it persists: is the job disabled (`launchctl print-disabled {domain()}`), or switched off in "
            "System Settings > General > Login Items > Allow in the Background?"
        )
    if verb == "bootout" and result.returncode == 5:
        # bootout's EIO is launchd's catch-all; most often the job is held in another domain than gui/UID.
        return (
            f"If it persists: see which domain holds the job (`launchctl print {operand}`; one loaded with sudo "
            "lives in system/, not gui/), and whether this session has a GUI login (over SSH it may not)"
        )
    return ""


def check(result: Result) -> Result:
    if not result.ok:
        fail(result)
    return result


def is_not_loaded(result: Result) -> bool:
    return result.returncode in NOT_LOADED_CODES or any(t in result.text for t in NOT_LOADED_TEXT)


def is_transient_bootstrap_failure(result: Result) -> bool:
    return result.returncode in TRANSIENT_BOOTSTRAP_CODES or any(t in result.text for t in TRANSIENT_BOOTSTRAP_TEXT)


def print_service(label: str, timeout: float = COMMAND_TIMEOUT_S) -> Result:
    return run("print", service_target(label), timeout=timeout)


def bootout(label: str, timeout: float = COMMAND_TIMEOUT_S) -> Result:
    return run("bootout", service_target(label), timeout=timeout)


def kickstart(label: str) -> Result:
    return run("kickstart", "-k", service_target(label))


def enable(label: str) -> Result:
    """Clear a persistent `launchctl disable`; a disabled label cannot be bootstrapped (error 119 or 5)."""
    return run("enable", service_target(label))


def bootstrap_with_retry(
    plist_path: str,
    deadline_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Result, int]:
    """Bootstrap, retrying only the transient post-bootout failures until the deadline. Returns (result, retries)."""
    give_up_at = clock() + deadline_s
    retries = 0
    while True:
        result = run("bootstrap", domain(), plist_path)
        if result.ok or not is_transient_bootstrap_failure(result) or clock() >= give_up_at:
            return result, retries
        retries += 1
        sleep(RETRY_INTERVAL_S)


def wait_until_unloaded(label: str, deadline_s: float) -> bool:
    """bootout returns before launchd lets go of the job (it is still honouring ExitTimeOut); wait for that."""
    give_up_at = time.monotonic() + deadline_s
    while True:
        if is_not_loaded(print_service(label)):
            return True
        if time.monotonic() >= give_up_at:
            return False
        time.sleep(RETRY_INTERVAL_S)


_TOP_LEVEL_LINE = re.compile(r"^\s*([a-z][a-z ]*?) = (.*)$")
_LEADING_INT = re.compile(r"^-?\d+")


def parse_print(text: str) -> dict[str, str]:
    """The top-level `key = value` lines of `launchctl print <service>` (nested blocks are skipped)."""
    fields: dict[str, str] = {}
    depth = 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "}":
            depth -= 1
            continue
        match = _TOP_LEVEL_LINE.match(line)
        if depth == 1 and match and not stripped.endswith("{"):
            fields.setdefault(match.group(1), match.group(2).strip())
        if stripped.endswith("{"):
            depth += 1
    return fields


def _leading_int(value: str | None) -> int | None:
    match = _LEADING_INT.match(value or "")  # "78: EX_CONFIG" -> 78; "(never exited)" -> None
    return int(match.group()) if match else None


def parse_disabled(text: str, label: str) -> bool:
    """`launchctl print-disabled <domain>`: `"label" => disabled` (macOS 14+) or `=> true` (older)."""
    match = re.search(rf'^\s*"{re.escape(label)}"\s*=>\s*(\w+)', text, re.MULTILINE)
    return match is not None and match.group(1) in ("disabled", "true")


def status_from_print(print_result: Result, disabled_text: str, label: str) -> dict[str, Any]:
    fields = parse_print(print_result.stdout) if print_result.ok else {}
    return {
        "label": label,
        "loaded": print_result.ok,
        "pid": _leading_int(fields.get("pid")),
        "last_exit_status": _leading_int(fields.get("last exit code")),
        "last_signal": fields.get("last terminating signal"),
        "disabled": parse_disabled(disabled_text, label),
        "raw_state": fields.get("state"),
        "path": fields.get("path"),
    }


def launchd_status(label: str, timeout: float = STATUS_TIMEOUT_S) -> dict[str, Any] | None:
    """What launchd knows about the job; None when there is no launchctl (not macOS). A launchctl that
    does not answer is reported as such (`error`), never as "not loaded", and is not asked twice."""
    if not available():
        return None
    printed = print_service(label, timeout=timeout)
    if printed.timed_out:
        return {**status_from_print(printed, "", label), "loaded": None, "error": printed.text}  # JSON: null
    disabled = run("print-disabled", domain(), timeout=timeout)
    status = status_from_print(printed, disabled.stdout if disabled.ok else "", label)
    if disabled.timed_out:
        status["error"] = disabled.text  # loaded or not is known; whether it is disabled is not
    return status


def format_status(status: dict[str, Any] | None) -> str:
    """One line for `veloxd status`."""
    if status is None:
        return "launchd: not available (no launchctl on PATH)"
    label = status["label"]
    if status["loaded"] is None:
        return f"launchd: {label} unknown: {status['error']}"
    if status["loaded"]:
        parts = [f"state {status['raw_state'] or 'unknown'}", f"pid {status['pid']}" if status["pid"] else "no pid"]
        if status["last_exit_status"] is not None:
            parts.append(f"last exit {status['last_exit_status']}")
        if status["last_signal"]:
            parts.append(f"last signal {status['last_signal']}")
        line = f"launchd: {label} loaded, " + ", ".join(parts)
    else:
        line = f"launchd: {label} not loaded"
    if status.get("error"):
        line = f"{line}; whether it is disabled is unknown: {status['error']}"
    if status["disabled"]:
        return (
            f"{line}; DISABLED: run `launchctl enable {service_target(label)}` and `veloxd install`, and check"
            " System Settings > General > Login Items > Allow in the Background"
        )
    return line if status["loaded"] else f"{line} (`veloxd install` loads it)"
