"""Liveness with real processes: a SIGSTOPped worker is noticed, marked unresponsive (state file,
`veloxd status`, the dashboard's state and /metrics, an event), killed and restarted, while its
neighbour keeps serving. Stand-in workers (tests/fixtures/fake_worker.py) answer /health at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_gone
from tests.support import free_port, http_json, wait_until
from tests.web.support import Page, config_text

FAST_HEALTH = {"interval_s": 0.2, "timeout_s": 0.5, "failures": 2}
STOP_S = 15  # SIGTERM cannot end a stopped process: it stays unresponsive this long, then SIGKILL


def test_a_stopped_worker_is_marked_unresponsive_killed_and_restarted(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    page = Page(h, free_port())
    servers = {
        "hung": entry(free_port(), health=FAST_HEALTH, stop_timeout_s=STOP_S),
        "calm": entry(free_port(), health=FAST_HEALTH),
    }
    h.write(config_text(servers, {"port": page.port, "interval_s": 0.2}))
    stopped: int | None = None
    try:
        h.start()
        up = h.wait_states({"hung": "ready", "calm": "ready"})
        page.wait_ready()
        mark = h.mark()
        stopped = up["hung"]["pid"]
        os.kill(stopped, signal.SIGSTOP)

        event = h.wait_event("server_unresponsive", after=mark, server="hung")
        assert event["pid"] == stopped and event["failures"] == 2 and event["from_state"] == "ready"
        assert event["timeout_s"] == 0.5 and event["interval_s"] == 0.2 and event["stop_timeout_s"] == STOP_S
        assert "no answer within 0.5 s" in event["error"]
        assert len(h.events("server_health_failed", server="hung")) >= 2
        h.wait_states({"hung": "unresponsive"})
        status = h.cli("status")
        row = next(line for line in status.stdout.splitlines() if line.startswith("hung "))
        assert "unresponsive" in row and str(stopped) in row, status.stdout
        assert status.returncode == 3
        page.wait_metrics(
            ("veloxd_server_state", {"server": "hung", "state": "unresponsive"}, 1.0),
            ("veloxd_server_state", {"server": "calm", "state": "ready"}, 1.0),
        )
        wait_until(lambda: page.server("hung").get("state") == "unresponsive", 60, what="the dashboard's state")

        killed = h.wait_event("server_killed", after=mark, server="hung")
        assert killed["pid"] == stopped
        backoff = h.wait_event("server_backoff", after=mark, server="hung")
        assert backoff["reason"] == "unresponsive" and backoff["from_state"] == "unresponsive"
        wait_gone([stopped], 60)
        again = h.wait_states({"hung": "ready", "calm": "ready"})
        assert again["hung"]["pid"] != stopped and again["hung"]["restarts"] == 1
        assert "unresponsive: 2 health probes failed in a row" in (again["hung"]["last_error"] or "")
        assert again["calm"]["pid"] == up["calm"]["pid"] and not h.events("server_unresponsive", server="calm")
        reply = http_json(
            f"http://127.0.0.1:{servers['hung']['port']}/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply[0] == 200
        assert h.stop() == 0
    finally:
        if stopped is not None and pid_alive(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        h.cleanup()


def test_status_shows_the_daemons_live_pids_when_the_state_file_lags(tmp_path: Path) -> None:
    """The state file holds what the daemon last managed to write (a full disk stops it); `status`
    asks the running daemon, so a pid replaced since then is never shown. Here the file is made
    stale by hand: the daemon rewrites it only when its own view changes."""
    h = DaemonHarness(tmp_path)
    h.write({"a": entry(free_port(), health={"interval_s": 3600})})
    try:
        h.start()
        up = h.wait_states({"a": "ready"})
        state_file = h.state_dir / "state.json"
        stale = json.loads(state_file.read_text())
        stale["servers"]["a"] = {**stale["servers"]["a"], "pid": 4_000_000, "state": "backoff"}
        state_file.write_text(json.dumps(stale))
        status = h.cli("status")
        row = next(line for line in status.stdout.splitlines() if line.startswith("a "))
        assert str(up["a"]["pid"]) in row and "ready" in row and "4000000" not in row, status.stdout
        assert status.returncode == 0
        as_json = json.loads(h.cli("status", "--json").stdout)
        assert as_json["servers"]["a"]["pid"] == up["a"]["pid"]
        assert json.loads(state_file.read_text())["servers"]["a"]["pid"] == 4_000_000  # still stale
        assert h.stop() == 0
    finally:
        h.cleanup()
