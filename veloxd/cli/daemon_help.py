"""The --help descriptions of `veloxd reload`, `restart` and `logs`: what each does, then its
exit codes as one table per command, shown as `veloxd status --help` shows its own
(veloxd.daemon.exitcodes). Stdlib only.

The codes are those veloxd/cli/daemon.py returns; tests/cli/test_cli_exit_codes.py brings about
each row with a real daemon (or none) and checks the command exits with that row's code.
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
USAGE = (EXIT_USAGE, "the command line is invalid")
NO_DAEMON = "no daemon answers on this state directory's control socket"

SUMMARIES = {
    "reload": "Make the running daemon re-read its config now, as SIGHUP does, and print what the reload did: "
    "servers added, removed, changed (restarted) or updated in place.",
    "restart": "Stop one server and start it again; a FATAL server gets a fresh start.",
    "logs": "Print the daemon's JSON log, its rotated files first: every line, one server's, or the last N; "
    "--follow keeps printing new lines, --pretty renders them as `veloxd run` does on a terminal.",
}

# (code, situation), in code order.
TABLES: dict[str, tuple[tuple[int, str], ...]] = {
    "reload": (
        (EXIT_OK, "the config was reloaded, or is unchanged since the last reload"),
        (
            EXIT_FAILED,
            f"{NO_DAEMON}, the config is invalid (its errors are printed, and the servers keep running on the "
            "last good config, if there was one), or the daemon refused (it is stopping)",
        ),
        USAGE,
    ),
    "restart": (
        (
            EXIT_OK,
            "the daemon accepted the restart (it goes on in the background: `veloxd status` shows when it is ready)",
        ),
        (EXIT_FAILED, f"{NO_DAEMON}, it has no server of that name (the answer lists them), or it is stopping"),
        USAGE,
    ),
    "logs": (
        (EXIT_OK, "the lines were printed, also when none matched, or until Ctrl-C ended --follow"),
        (EXIT_FAILED, "the log file does not exist"),
        USAGE,
    ),
}


def exit_text(command: str) -> str:
    """The table of `command` as one paragraph."""
    rows = "; ".join(f"{code}: {situation}" for code, situation in TABLES[command])
    return f"Exit status: {rows}."


def description(command: str) -> str:
    return f"{SUMMARIES[command]} {exit_text(command)}"
