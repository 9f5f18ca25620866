"""The daemon with real `veloxd serve` workers on the tiny model: ready, edit one, stop, die.

The stand-in worker covers timing elsewhere; this proves the READY line + /health contract,
the per-entry restart and the clean exits with the real thing.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_gone
from tests.support import free_port, http_json

LOAD_S = 180  # two model loads on two busy CPU cores


@pytest.mark.slow
def test_real_workers_come_up_restart_alone_and_leave_nothing_behind(tmp_path: Path, tiny_model: Path) -> None:
    """Two real servers become READY (READY line and /health); editing one restarts only it;
    SIGTERM stops both and exits 0; after a restart of the daemon, SIGKILL of it ends both
    workers within 2 s through the lifeline."""
    h = DaemonHarness(tmp_path, real_worker=True)
    servers = {
        "alpha": entry(free_port(), model=str(tiny_model), method="affine", bits=4, ready_timeout_s=LOAD_S),
        "beta": entry(free_port(), model=str(tiny_model), method="fp16", ready_timeout_s=LOAD_S),
    }
    h.write(servers)
    try:
        h.start()
        up = h.wait_states({"alpha": "ready", "beta": "ready"}, timeout=LOAD_S)
        ready = {r["server"]: r for r in h.events("server_ready")}
        assert ready["alpha"]["ready"]["layer_caches"] == {"AffineCache": 2}
        assert ready["alpha"]["ready"]["pid"] == up["alpha"]["pid"]
        for name, server in servers.items():
            assert http_json(f"http://127.0.0.1:{server['port']}/health", timeout=10)[0] == 200, name

        mark = h.mark()
        servers["beta"] = {**servers["beta"], "method": "kivi", "bits": 4}
        h.write(servers)
        restarted = h.wait_event("server_ready", after=mark, server="beta", timeout=LOAD_S)
        assert restarted["ready"]["method"] == "kivi" and restarted["pid"] != up["beta"]["pid"]
        after = h.wait_states({"alpha": "ready", "beta": "ready"})
        assert after["alpha"]["pid"] == up["alpha"]["pid"] and not pid_alive(up["beta"]["pid"])

        spawned = h.spawned_pids()
        assert h.stop(timeout=60) == 0
        wait_gone(spawned, 120)

        mark = h.mark()
        h.start()
        up = h.wait_states({"alpha": "ready", "beta": "ready"}, timeout=LOAD_S)
        workers = [up["alpha"]["pid"], up["beta"]["pid"]]
        h.signal(signal.SIGKILL)
        assert h.proc is not None
        h.proc.wait(120)
        wait_gone(workers, 120)  # real workers end by themselves once the lifeline closes
    finally:
        h.cleanup()
