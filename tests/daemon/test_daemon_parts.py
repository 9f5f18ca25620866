"""The daemon's OS-facing parts on their own: JSON logging, state file, processes, ports."""

from __future__ import annotations

import json
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, wait_until
from veloxd import protocol
from veloxd.daemon.logs import FIXED_KEYS
from veloxd.daemon.probe import health_ok
from veloxd.daemon.process import Child, Lifeline, describe_exit, is_same_process, process_start_time
from veloxd.daemon.statefile import AlreadyRunning, acquire_lock, read_state, write_state
from veloxd.daemon.views import read_lines
from veloxd.endpoints import port_holder, port_in_use

FAKE_WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "fake_worker.py"


def test_structlog_and_stdlib_lines_share_one_json_shape(tmp_path: Path) -> None:
    """Our events and a third-party stdlib logger both come out as JSON with the fixed keys."""
    log_file = tmp_path / "logs" / "veloxd.jsonl"
    script = textwrap.dedent(f"""
        import logging
        from pathlib import Path
        from veloxd.daemon.logs import configure_logging, get_logger
        configure_logging(Path({str(log_file)!r}), log_format="auto", max_bytes=4000, backups=3)
        get_logger("veloxd.daemon").info("daemon_started", pid=42)
        logging.getLogger("watchdog.observers").warning("inotify %s", "overflow")
        logging.getLogger("watchdog.observers").debug("dropped: below WARNING")
        for i in range(40):
            get_logger("veloxd.server").info("server_output", server="a", pid=1, stream="stdout", line="x" * 50)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    records = [json.loads(line) for line in read_lines(log_file, None)]
    assert len(records) == 42  # rotation kept every line across the live file and its backups
    assert (tmp_path / "logs" / "veloxd.jsonl.1").exists()
    for record in records:
        assert set(FIXED_KEYS) <= set(record), record
        assert record["timestamp"].endswith("Z") and "T" in record["timestamp"]
    expected = {"event": "daemon_started", "level": "info", "logger": "veloxd.daemon", "pid": 42}
    assert records[0] == {**records[0], **expected}
    assert records[1]["event"] == "inotify overflow"
    assert records[1]["logger"] == "watchdog.observers" and records[1]["level"] == "warning"
    assert [r["server"] for r in read_lines_json(log_file, "a")] == ["a"] * 40


def read_lines_json(log_file: Path, server: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_lines(log_file, server)]


def test_a_record_still_being_written_is_not_read(tmp_path: Path) -> None:
    """`veloxd logs` reads while the daemon writes: a last line without its newline is not printed half."""
    log_file = tmp_path / "veloxd.jsonl"
    done = [json.dumps({"event": "server_ready", "server": "a"}), json.dumps({"event": "server_output", "server": "a"})]
    log_file.write_text("\n".join(done) + "\n" + done[0][:17])
    assert list(read_lines(log_file, None)) == done
    with open(log_file, "a") as handle:
        handle.write(done[0][17:] + "\n")
    assert list(read_lines(log_file, None)) == [*done, done[0]]


def test_state_file_is_replaced_atomically_and_read_back(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    write_state(tmp_path, {"servers": {"a": {"state": "ready"}}})
    write_state(tmp_path, {"servers": {"a": {"state": "stopped"}}})
    assert read_state(tmp_path) == {"servers": {"a": {"state": "stopped"}}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp file left behind
    (tmp_path / "state.json").write_text("{not json")
    assert read_state(tmp_path) is None


def test_state_dir_lock_admits_one_daemon(tmp_path: Path) -> None:
    first = acquire_lock(tmp_path)
    with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"):
        acquire_lock(tmp_path)
    first.close()
    acquire_lock(tmp_path).close()


def test_state_dir_lock_is_held_when_the_pid_cannot_be_written(tmp_path: Path) -> None:
    """Writing the pid fails (a full disk; here a file-size limit of 0 bytes, EFBIG): the lock is
    still taken, and a second daemon is refused without a pid to name, not with a traceback."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    on_excess = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing us
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, limits[1]))
        first = acquire_lock(tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, on_excess)
    try:
        assert (tmp_path / "daemon.lock").read_text() == ""  # the write really failed
        with pytest.raises(AlreadyRunning, match="unknown pid") as refused:
            acquire_lock(tmp_path)
        message = str(refused.value)  # said in words, not `pid unknown pid`
        assert "pid unknown pid" not in message and "(pid " not in message
        assert f"another veloxd daemon is running with state dir {tmp_path}" in message
        assert "records none" in message and refused.value.holder is None
    finally:
        first.close()


def test_a_state_path_that_is_a_directory_reads_as_no_state(tmp_path: Path) -> None:
    (tmp_path / "state.json").mkdir()
    assert read_state(tmp_path) is None


def test_process_identity_needs_pid_and_start_time() -> None:
    """A pid alone is not enough: a different start time means a different process."""
    mine = process_start_time(os.getpid())
    assert mine is not None and mine == process_start_time(os.getpid())
    assert is_same_process(os.getpid(), mine)
    assert not is_same_process(os.getpid(), mine + "0")
    assert not is_same_process(os.getpid(), None)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_start_time(proc.pid) is None


def test_port_checks_find_a_listener_and_its_holder() -> None:
    port = free_port()
    assert not port_in_use("127.0.0.1", port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert port_in_use("127.0.0.1", port)
        assert port_in_use("0.0.0.0", port)
        holder = port_holder(port)
        assert holder is not None and f"pid {os.getpid()}" in holder
    assert not health_ok("127.0.0.1", port, timeout=0.2)


def test_child_output_is_drained_and_reported_before_its_exit() -> None:
    """Every line reaches the handler, in order, before the exit report; the tail keeps the last ones."""
    lines: list[tuple[str, str]] = []
    exits: queue.SimpleQueue[int] = queue.SimpleQueue()
    code = "import sys\nfor i in range(2000): print('line', i)\nprint('oops', file=sys.stderr)\nsys.exit(3)"
    child = Child(
        [sys.executable, "-c", code],
        dict(os.environ),
        None,
        lambda pid, stream, line: lines.append((stream, line)),
        exits.put,
    )
    assert exits.get(timeout=120) == 3
    assert [line for stream, line in lines if stream == "stdout"] == [f"line {i}" for i in range(2000)]
    assert ("stderr", "oops") in lines
    assert child.last_lines() == {"stdout": [f"line {i}" for i in range(1980, 2000)], "stderr": ["oops"]}
    assert describe_exit(3) == {"code": 3, "signal": None}
    assert describe_exit(-signal.SIGKILL) == {"code": None, "signal": "SIGKILL"}


def test_a_held_child_hands_over_no_line_until_released(tmp_path: Path) -> None:
    """The daemon logs a start's event (with the pid) before the worker's first line, however fast it prints."""
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    printed, go = tmp_path / "printed", tmp_path / "go"
    code = textwrap.dedent(
        f"""
        import os, time
        print("first", flush=True)
        open({str(printed)!r}, "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        print("second", flush=True)
        """
    )
    child = Child(
        [sys.executable, "-c", code],
        dict(os.environ),
        None,
        lambda pid, stream, line: lines.put(line),
        print,
        held=True,
    )
    try:
        wait_until(printed.exists, timeout=60)  # "first" is in the pipe
        assert lines.empty() and child.last_lines()["stdout"] == []
        child.release_output()
        assert lines.get(timeout=60) == "first"
    finally:
        go.touch()
    assert lines.get(timeout=60) == "second"
    child.join(60)


def test_worker_exits_when_the_lifeline_closes(tmp_path: Path) -> None:
    """Closing the daemon's end of the pipe (what the kernel does when it dies) ends the worker."""
    lifeline = Lifeline()
    port = free_port()
    exits: queue.SimpleQueue[int] = queue.SimpleQueue()
    ready = threading.Event()
    argv = [
        sys.executable,
        str(FAKE_WORKER),
        protocol.ENTRY_JSON_FLAG,
        protocol.entry_document({"model": "m", "kv": {"method": "affine"}, "port": port}),
        "--lifeline-fd",
        str(lifeline.read_fd),
    ]
    child = Child(
        argv,
        dict(os.environ),
        lifeline,
        lambda pid, stream, line: ready.set() if line.startswith("VELOXD_READY") else None,
        exits.put,
    )
    assert ready.wait(120)
    wait_until(lambda: health_ok("127.0.0.1", port), 120, what="/health")
    lifeline.close()
    assert exits.get(timeout=120) == 0  # it exited by itself: nobody signalled it
    assert any("lifeline closed" in line for line in child.last_lines()["stderr"])


def test_a_step_that_raises_is_logged_answered_and_counted_and_the_daemon_goes_on(tmp_path: Path) -> None:
    """The daemon's safety net for its own bugs (two once crashed it mid-reload, ending every
    worker): the step's exception is logged with its traceback, a client waiting on that message
    is answered at once, `status` counts it, and the next step runs."""
    from structlog.testing import capture_logs

    from veloxd.daemon import messages as m
    from veloxd.daemon.daemon import Daemon, RunOptions
    from veloxd.daemon.views import render_status

    daemon = Daemon(RunOptions(tmp_path / "veloxd.yaml", None, tmp_path / "state"))
    reply = m.Reply()
    ran: list[float] = []

    def broken(key: str) -> None:
        raise KeyError(key)

    with capture_logs() as logged:
        daemon._step("ReloadRequested", broken, "servers", reply=reply)
        daemon._step("timers", ran.append, 1.0)
    [failed] = [e for e in logged if e["event"] == "daemon_step_failed"]
    assert failed["step"] == "ReloadRequested" and failed["error"] == "KeyError: 'servers'" and failed["exc_info"]
    answer = reply.wait(timeout=5)
    assert answer is not None and answer["ok"] is False and "KeyError" in answer["error"]
    assert ran == [1.0] and daemon.step_failures == 1
    shown = render_status({"daemon": {"running": True, "pid": 1, "step_failures": 1}, "servers": {}})
    assert "1 internal error(s) caught, servers kept" in shown
