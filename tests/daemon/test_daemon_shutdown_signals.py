"""Ctrl-C under a wrapper that forwards it (`make run`) is one request to stop, not two; a wrapper
that dies without a word (its lifeline closes) stops the daemon as SIGTERM would.

The terminal's SIGINT reaches the whole foreground group, daemon included, and the demo forwards
its own copy: the daemon merges signals closer together than REPEAT_WINDOW_S, so its workers get
SIGTERM and their grace period; a second Ctrl-C pressed later still SIGKILLs at once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import free_port
from veloxd.daemon.shutdown import REPEAT_WINDOW_S, forces_kill


def test_forces_kill_only_for_a_later_signal() -> None:
    assert not forces_kill(None, 100.0)  # the first signal: graceful stop
    assert not forces_kill(100.0, 100.0)
    assert not forces_kill(100.0, 100.0 + REPEAT_WINDOW_S / 2)  # a forwarded copy
    assert forces_kill(100.0, 100.0 + REPEAT_WINDOW_S)  # a person pressing Ctrl-C again
    assert forces_kill(100.0, 160.0, window_s=30.0)


def test_a_forwarded_copy_of_ctrl_c_does_not_sigkill_the_workers(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    slow_stop = {"FAKE_STOP_DELAY_S": "3"}  # the daemon is still stopping when the copy arrives
    h.write({"alpha": entry(free_port(), env=slow_stop), "beta": entry(free_port(), env=slow_stop)})
    try:
        h.start()
        h.wait_states({"alpha": "ready", "beta": "ready"})
        assert h.proc is not None
        first_sent = time.time()
        os.kill(h.proc.pid, signal.SIGINT)  # the terminal's
        # The wrapper's copy, once the daemon has handled the first (two pending SIGINTs are one to the
        # kernel, which would prove nothing about the daemon).
        h.wait_event("daemon_stopping")
        os.kill(h.proc.pid, signal.SIGINT)
        copy_sent = time.time()
        assert h.proc.wait(60) == 0
        stopped = h.events("server_stopped")
        assert {r["server"] for r in stopped} == {"alpha", "beta"}
        merged = h.events("daemon_signal_merged", signal="SIGINT")
        if merged:
            assert merged[0]["since_first_s"] < REPEAT_WINDOW_S
            assert all(r["killed"] is False and r["exit"]["code"] == 0 for r in stopped), stopped
        else:  # only a machine too loaded to send the copy within the window may escalate
            forced = h.events("daemon_kill_forced", signal="SIGINT")
            assert forced and forced[0]["since_first_s"] >= REPEAT_WINDOW_S, forced
            assert copy_sent - first_sent >= REPEAT_WINDOW_S - 0.1  # arrival times: both sent that far apart
    finally:
        h.cleanup()


def test_a_second_ctrl_c_pressed_later_kills_at_once(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    stubborn = entry(free_port(), stop_timeout_s=120, env={"FAKE_IGNORE_TERM": "1"})
    h.write({"stubborn": stubborn})
    try:
        h.start()
        h.wait_states({"stubborn": "ready"})
        assert h.proc is not None
        h.signal(signal.SIGINT)
        h.wait_event("server_stopping", server="stubborn")
        time.sleep(REPEAT_WINDOW_S * 1.5)  # a lower bound: the second press comes later than a forwarded copy
        h.signal(signal.SIGINT)
        assert h.proc.wait(110) == 0
        stopped = h.events("server_stopped", server="stubborn")[-1]
        assert stopped["killed"] is True and stopped["exit"]["signal"] == "SIGKILL"
        assert not h.events("server_killed")  # not the stop timeout's SIGKILL: the second signal's
        assert not h.events("daemon_signal_merged")
        forced = h.events("daemon_kill_forced", signal="SIGINT")
        assert len(forced) == 1 and forced[0]["since_first_s"] >= REPEAT_WINDOW_S, forced
    finally:
        h.cleanup()


def test_a_closed_lifeline_stops_every_server_and_the_daemon(tmp_path: Path) -> None:
    """What a SIGKILLed wrapper leaves: the write end of --lifeline-fd closed by the kernel."""
    h = DaemonHarness(tmp_path)
    h.write({"alpha": entry(free_port()), "beta": entry(free_port())})
    read_end, write_end = os.pipe()
    try:
        h.start("--lifeline-fd", str(read_end), pass_fds=(read_end,))
        os.close(read_end)
        h.wait_states({"alpha": "ready", "beta": "ready"})
        assert h.proc is not None
        os.write(write_end, b"ignored")  # bytes are not EOF: the daemon keeps running
        os.close(write_end)
        write_end = -1
        assert h.proc.wait(60) == 0
        gone = h.events("daemon_wrapper_gone")
        assert len(gone) == 1 and gone[0]["lifeline_fd"] == read_end, gone
        [stopping] = h.events("daemon_stopping")
        assert stopping["cause"] == "wrapper_gone" and stopping["signal"] is None, stopping
        stopped = h.events("server_stopped")
        assert {r["server"] for r in stopped} == {"alpha", "beta"}
        assert all(r["killed"] is False for r in stopped), stopped  # a graceful stop, as on SIGTERM
    finally:
        if write_end >= 0:
            os.close(write_end)
        h.cleanup()
