"""The verdict on a worker's exit nobody asked for (veloxd.daemon.exits.after_exit), case by case."""

from __future__ import annotations

import signal
from typing import TypedDict

import pytest

from veloxd import protocol
from veloxd.daemon.exits import Crashed, PortTaken, after_exit
from veloxd.daemon.state import ServerState

S = ServerState


class Where(TypedDict):
    """The entry's address, after_exit's keyword arguments `host` and `port`."""

    host: str
    port: int


WHERE: Where = {"host": "127.0.0.1", "port": 9123}
QUIET: dict[str, list[str]] = {"stdout": [], "stderr": []}
SAID = {"stdout": [], "stderr": ["loading", "veloxd serve: port 9123 on 127.0.0.1 is in use (by pid 77)", " "]}
PORT_IN_USE = int(protocol.ExitCode.PORT_IN_USE)


def test_a_port_taken_while_starting_is_waited_for_with_the_workers_words_or_ours() -> None:
    verdict = after_exit(
        S.STARTING,
        PORT_IN_USE,
        SAID,
        "port 9123 on 127.0.0.1 is in use (by pid 77)",
        timed_out=False,
        refused=None,
        **WHERE,
    )
    assert isinstance(verdict, PortTaken) and verdict.condition.to_dict() == {
        "kind": "port",
        "key": "port",
        "message": "port 9123 on 127.0.0.1 is in use (by pid 77)",
    }
    silent = after_exit(S.STARTING, PORT_IN_USE, QUIET, None, timed_out=False, refused=None, **WHERE)
    assert isinstance(silent, PortTaken) and silent.condition.message == "port 9123 on 127.0.0.1 is in use"


@pytest.mark.parametrize(
    "state,returncode,timed_out,expected",
    [
        (
            S.STARTING,
            PORT_IN_USE,
            True,
            Crashed("ready_timeout", None, "ready_timeout: code 4"),
        ),  # killed: not the port
        (S.READY, PORT_IN_USE, False, Crashed("exited", None, "exited: code 4")),  # only a start binds
        (S.READY, -signal.SIGKILL, False, Crashed("exited", None, "exited: SIGKILL")),
        (S.STARTING, -signal.SIGKILL, True, Crashed("ready_timeout", None, "ready_timeout: SIGKILL")),
        (S.UNRESPONSIVE, -signal.SIGKILL, False, Crashed("unresponsive", None, None)),  # its error stands
        (
            S.STARTING,
            2,
            False,
            Crashed("exited", "worker exited with code 2 (invalid input; see last_lines)", "exited: code 2"),
        ),
    ],
)
def test_crashes_name_their_reason_and_what_to_read(
    state: ServerState, returncode: int, timed_out: bool, expected: Crashed
) -> None:
    assert after_exit(state, returncode, QUIET, None, timed_out=timed_out, refused=None, **WHERE) == expected


def test_the_last_stderr_line_is_what_to_read_and_code_2_is_unfixable_with_the_workers_words() -> None:
    tail = {"stdout": ["x"], "stderr": ["Traceback", "ValueError: bits must be 2..8", "  "]}
    verdict = after_exit(S.STARTING, 2, tail, "ValueError: bits must be 2..8", timed_out=False, refused=None, **WHERE)
    assert verdict == Crashed(
        "exited", "worker exited with code 2: ValueError: bits must be 2..8", "ValueError: bits must be 2..8"
    )


def test_a_refused_ready_line_is_unfixable_whatever_the_exit_code() -> None:
    refused = "the worker runs bits 4, the entry asks for bits 3"
    verdict = after_exit(S.STARTING, -signal.SIGKILL, QUIET, None, timed_out=False, refused=refused, **WHERE)
    assert verdict == Crashed("exited", refused, "exited: SIGKILL")


def test_routine_worker_log_lines_are_not_what_to_read() -> None:
    """A worker killed from outside (the OOM killer, kill -9) whose last stderr line is progress:
    status says how it ended, not `INFO kv_figure_saved ...`; a warning or an error line still wins."""
    progress = {"stdout": [], "stderr": ["INFO kv_figure_saved path=/state/f.json", "DEBUG polled"]}
    verdict = after_exit(S.READY, -signal.SIGKILL, progress, None, timed_out=False, refused=None, **WHERE)
    assert verdict == Crashed("exited", None, "exited: SIGKILL")
    warned = {"stdout": [], "stderr": ["WARNING request_cancelled reason=shutdown", "INFO kv_figure_saved path=/f"]}
    verdict = after_exit(S.READY, 1, warned, None, timed_out=False, refused=None, **WHERE)
    assert verdict == Crashed("exited", None, "WARNING request_cancelled reason=shutdown")


def test_a_ranks_refusal_is_the_groups_account_not_the_launchers_summary() -> None:
    """From an audit: a distributed group's stderr tags each rank's lines `[rank N] `, so the rank's
    own `veloxd serve: ...` refusal was missed and status said only 'see last_lines'."""
    from veloxd.daemon.process import error_line

    refusal = "error: model type 'gemma' has no tensor-parallel sharding in mlx_lm; use parallelism: pipeline"
    tail = {
        "stdout": [],
        "stderr": [
            f"[rank 0] {protocol.WORKER_PREFIX}{refusal}",
            "[rank 1] INFO loading",
            "veloxd launcher: rank 0 (127.0.0.1) exited with code 2; the group stops with it",
        ],
    }
    assert error_line(tail) == refusal
    verdict = after_exit(S.STARTING, 2, tail, error_line(tail), timed_out=False, refused=None, **WHERE)
    assert isinstance(verdict, Crashed) and verdict.unfixable == f"worker exited with code 2: {refusal}"
    crashed = {
        "stdout": [],
        "stderr": ["[rank 1] Traceback (most recent call last):", "[rank 1] RuntimeError: ring broke"],
    }
    assert error_line(crashed) == "RuntimeError: ring broke"
