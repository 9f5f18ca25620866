"""What the exit of a server's worker that nobody asked to stop leads to: a pure decision.

ServerProcess gathers the facts (its state, the exit code, the worker's last lines, whether the
ready timeout or a refused READY line killed it) and acts on the verdict: wait for a port taken
meanwhile, or count a failure (BACKOFF, or FATAL when retrying cannot help).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from veloxd import protocol
from veloxd.config.world import Condition
from veloxd.daemon.process import describe_exit, exit_account
from veloxd.daemon.state import ServerState

S = ServerState
UNFIXABLE_EXIT = protocol.ExitCode.INVALID  # the worker's "invalid input", the download's "not found, gated...": final


@dataclass(frozen=True)
class PortTaken:
    """Free when the daemon looked, taken when the worker bound it: the port's holder is the world's
    doing, so WAITING for it as the check before spawning would have (no failure counted)."""

    condition: Condition


@dataclass(frozen=True)
class Crashed:
    """A failure, counted against the restart policy; FATAL at once when `unfixable` says why."""

    reason: str  # "exited", "ready_timeout" or "unresponsive"
    unfixable: str | None
    last_error: str | None  # what a person should read first; None: the one already set stands


def after_exit(
    state: ServerState,
    returncode: int,
    tail: Mapping[str, list[str]],
    said: str | None,
    *,
    timed_out: bool,
    refused: str | None,
    host: str,
    port: int,
) -> PortTaken | Crashed:
    """The verdict on an exit in STARTING, READY or UNRESPONSIVE.

    `said` is the worker's own account (veloxd.daemon.process.error_line of `tail`); `timed_out`:
    the daemon killed it at ready_timeout_s; `refused`: it killed it for a READY line that did not
    match the entry (always unfixable: the same settings give the same line).
    """
    if state is S.STARTING and returncode == protocol.ExitCode.PORT_IN_USE and not timed_out:
        return PortTaken(Condition("port", ("port",), said or f"port {port} on {host} is in use"))
    reason = "ready_timeout" if timed_out else "unresponsive" if state is S.UNRESPONSIVE else "exited"
    last_error = None  # unresponsive: the error set when it was killed says why
    if reason != "unresponsive":
        exit_text = describe_exit(returncode)
        last_error = exit_account(tail) or (f"{reason}: {exit_text['signal'] or 'code ' + str(exit_text['code'])}")
    unfixable = refused
    if unfixable is None and returncode == UNFIXABLE_EXIT:
        unfixable = (
            f"worker exited with code 2: {said}"
            if said
            else "worker exited with code 2 (invalid input; see last_lines)"
        )
    return Crashed(reason, unfixable, last_error)
