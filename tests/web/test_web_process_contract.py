"""`veloxd web` and `veloxd gateway` keep the worker protocol's exit codes and lifeline.

The daemon supervises them like workers (veloxd/protocol.py): a port another process holds is
exit 4, which the daemon waits on (a condition of the world), not exit 2, which would make the
process FATAL for good; EOF on the lifeline ends them within LIFELINE_GRACE_S of a clean stop.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.support import free_port, veloxd_cmd, wait_until
from veloxd.protocol import CONTROL_SOCKET_ENV, READY_PREFIX, ExitCode, parse_ready


def test_the_dashboard_exits_port_in_use_when_its_port_is_held(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        done = subprocess.run(
            veloxd_cmd("web", "--state-dir", str(tmp_path), "--port", str(port)),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == ExitCode.PORT_IN_USE, done.stderr
    assert f"cannot bind 127.0.0.1:{port}" in done.stderr


def test_the_dashboard_leaves_when_its_lifeline_closes_and_its_ready_line_is_the_protocols(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        veloxd_cmd("web", "--state-dir", str(tmp_path), "--port", str(free_port()), "--lifeline-fd", str(read_end)),
        pass_fds=(read_end,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(read_end)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(READY_PREFIX), line
        assert parse_ready(line.strip())["pid"] == process.pid
        os.close(write_end)
        wait_until(lambda: process.poll() is not None, timeout=60, what="the dashboard to exit after EOF")
        assert process.returncode == ExitCode.OK
        assert process.stderr is not None and "lifeline closed" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()  # closes the pipes


def test_a_gateway_started_by_hand_says_it_needs_the_daemon() -> None:
    env = {key: value for key, value in os.environ.items() if key != CONTROL_SOCKET_ENV}
    done = subprocess.run(
        veloxd_cmd("gateway", "--host", "127.0.0.1", "--port", str(free_port())),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == ExitCode.INVALID
    assert f"{CONTROL_SOCKET_ENV} is not set" in done.stderr
