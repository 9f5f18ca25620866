"""The state file is rewritten when what it shows changes, and only then.

A real daemon with a stand-in worker: a hundred control requests that change nothing (status,
the gateway's view) and the loop's timers leave the file as it was (every write renames a new
file over it; a hard link held by the test keeps the old one, so its inode cannot be reused);
a restart is on disk as soon as it happened.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import free_port
from veloxd.daemon.control import request
from veloxd.daemon.statefile import state_path

REQUESTS = 50  # of each kind
QUIET = {"interval_s": 3600.0}  # no liveness probe during the test: each would be a change (health.probes)


def test_requests_that_change_nothing_leave_the_file_and_a_restart_is_written(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    h.write({"alpha": entry(free_port(), health=QUIET)})
    try:
        h.start()
        h.wait_states({"alpha": "ready"})
        path, held = state_path(h.state_dir), tmp_path / "state.held"
        os.link(path, held)
        shown = h.state()
        for _ in range(REQUESTS):
            assert request(h.state_dir, {"command": "status"})["state"]["servers"]["alpha"]["state"] == "ready"
            assert request(h.state_dir, {"command": "gateway_view"})["ok"] is True
        assert held.samefile(path) and h.state() == shown
        mark = h.mark()
        answer = request(h.state_dir, {"command": "restart", "name": "alpha"})
        assert answer == {"ok": True, "restarting": "alpha"}
        ready = h.wait_event("server_ready", after=mark, server="alpha")
        h.wait_states({"alpha": "ready"})
        written = h.server("alpha")
        assert written["pid"] == ready["pid"] != shown["servers"]["alpha"]["pid"] and written["restarts"] == 1
        assert not held.samefile(path)
        assert h.stop() == 0
        assert h.state()["daemon"]["running"] is False
    finally:
        h.cleanup()
