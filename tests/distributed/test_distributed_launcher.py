"""The group process (MLX's launcher with veloxd's pump) on stand-in ranks: exit codes, stop, lifeline, tags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.support import LOCAL_PAIR, ring_port
from tests.fixtures.daemon_harness import pid_alive, wait_gone
from tests.support import REPO

FAKE_RANK = Path(__file__).with_name("fake_rank.py")


def launch(leaving: int, code: int, marks: Path, lifeline: int | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "veloxd.distributed.launcher"]
    if lifeline is not None:
        argv += ["--lifeline-fd", str(lifeline)]
    argv += [
        "--backend",
        "ring",
        "--starting-port",
        str(ring_port()),
        "--hosts",
        ",".join(LOCAL_PAIR),
        "--",
        sys.executable,
        str(FAKE_RANK),
        str(leaving),
        str(code),
        str(marks),
    ]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)},
        pass_fds=() if lifeline is None else (lifeline,),
        start_new_session=True,
    )


def rank_pids(proc: subprocess.Popen[str], lines: list[str]) -> list[int]:
    """Read stdout until both ranks said their pid."""
    assert proc.stdout is not None
    while sum("] pid " in line for line in lines) < 2:
        line = proc.stdout.readline()
        assert line, f"group ended early: {lines}"
        lines.append(line.rstrip("\n"))
    return [int(line.rsplit(" ", 1)[1]) for line in lines if "] pid " in line]


@pytest.mark.slow
@pytest.mark.parametrize(("code", "group_code"), [(2, 2), (0, 3), (1, 3)])
def test_a_rank_that_ends_takes_the_group_down_with_a_telling_code(code: int, group_code: int, tmp_path: Path) -> None:
    """2 stays 2 (retrying cannot help: the daemon goes FATAL); anything else, even 0, is a failure (3)."""
    proc = launch(leaving=1, code=code, marks=tmp_path)
    try:
        lines: list[str] = []
        pids = rank_pids(proc, lines)
        assert proc.stdout is not None and proc.stderr is not None
        with proc.stdout, proc.stderr:  # not communicate(): readline() already buffered some output
            out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(120) == group_code, err
        wait_gone(pids, 10)
        lines += out.splitlines()
        assert "[rank 1] hello world" in lines  # two writes, one whole line, tagged
        assert "[rank 0] waiting" in lines
        assert f"rank 1 (127.0.0.1) exited with code {code}; the group stops with it" in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "lifeline", "sigkill"])
def test_stopping_the_group_process_leaves_no_rank(how: str, tmp_path: Path) -> None:
    """SIGTERM or EOF on the daemon's lifeline: the pump stops every rank and exits 0. SIGKILL of the
    group process alone: each rank sees EOF on its stdin (its own lifeline) and leaves."""
    read_end, write_end = os.pipe()
    proc = launch(leaving=9, code=0, marks=tmp_path, lifeline=read_end)  # no rank 9: both ranks wait
    os.close(read_end)
    try:
        pids = rank_pids(proc, [])
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif how == "lifeline":
            os.close(write_end)
        else:
            proc.send_signal(signal.SIGKILL)
        assert proc.wait(60) == (-signal.SIGKILL if how == "sigkill" else 0)
        wait_gone(pids, 30)
        assert not any(pid_alive(p) for p in pids)
    finally:
        if how != "lifeline":
            os.close(write_end)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)  # drains and closes the pipes
