"""`veloxd status`'s exit code: the one table of situations and codes, and the pure decision.

The table feeds the decision, `veloxd status --help` and docs/operations.md ("Status exit codes",
checked by tests/docs); a health check reads only the code. An `on_demand` server that is
`stopped` is in its normal state (it starts on its first request, and idle_unload_s stops it
again), so it does not make the code 3; an `always` server must be ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EXIT_READY, EXIT_NOT_RUNNING, EXIT_NOT_READY = 0, 1, 3
# Set by `veloxd status` on a state file it shows because the live daemon did not answer.
NOT_ANSWERING = "daemon_not_answering"

# The states in which a server counts as "as configured", by its `start:` mode.
SETTLED_STATES: Mapping[str, frozenset[str]] = {
    "always": frozenset({"ready"}),
    "on_demand": frozenset({"ready", "stopped"}),
}

# (daemon, servers, code): read top to bottom, the first row that applies decides.
TABLE: tuple[tuple[str, str, int], ...] = (
    ("not running, or never ran with this state directory", "any", EXIT_NOT_RUNNING),
    (
        "running, but not answering on its control socket (stopped, e.g. by SIGSTOP, or hung): what status shows "
        "is its last state file",
        "any",
        EXIT_NOT_READY,
    ),
    ("running, but no valid config was ever loaded, or the last reload was refused", "any", EXIT_NOT_READY),
    (
        "running",
        "a server has a restart, stop or start queued (`ready, restart queued`), or a restart held until its "
        "new settings can start (`ready, restart held: ...`)",
        EXIT_NOT_READY,
    ),
    (
        "running",
        "a `start: always` server is not `ready` (`downloading`, `waiting`, `starting`, `backoff`, `fatal`, "
        "`stopping`, `stopped`)",
        EXIT_NOT_READY,
    ),
    (
        "running",
        "a `start: on_demand` server is neither `ready` nor `stopped` (`downloading`, `waiting`, `starting`, "
        "`backoff`, `fatal`, `stopping`)",
        EXIT_NOT_READY,
    ),
    (
        "running",
        "every `start: always` server is `ready`, every `start: on_demand` server is `ready` or `stopped`",
        EXIT_READY,
    ),
)


def server_settled(server: Mapping[str, Any]) -> bool:
    """This server is as its `start:` mode wants it, with nothing queued for it."""
    settled = SETTLED_STATES.get(str(server.get("start") or "always"), SETTLED_STATES["always"])
    return server.get("state") in settled and not server.get("pending")


def exit_code(state: Mapping[str, Any] | None, alive: bool) -> int:
    """The code for this state file, `alive` saying whether its daemon process still runs."""
    if state is None or not alive:
        return EXIT_NOT_RUNNING
    if state.get(NOT_ANSWERING):
        return EXIT_NOT_READY
    reload = state.get("last_reload") or {}
    if state.get("degraded") or not reload.get("ok", True):
        return EXIT_NOT_READY
    servers = state.get("servers") or {}
    return EXIT_READY if all(server_settled(s) for s in servers.values()) else EXIT_NOT_READY


def help_text() -> str:
    """The table as one paragraph, for `veloxd status --help`."""
    rows = "; ".join(
        f"{code}: daemon {daemon}" + (f", {servers}" if servers != "any" else "") for daemon, servers, code in TABLE
    )
    return f"Exit status (the first case that applies): {rows}. Log write failures show, but do not change it."


def markdown_table() -> str:
    """The table as docs/operations.md shows it."""
    lines = ["| daemon | servers | exit code |", "|---|---|---|"]
    lines += [f"| {daemon} | {servers} | {code} |" for daemon, servers, code in TABLE]
    return "\n".join(lines)
