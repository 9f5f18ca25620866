"""A burst of edits ending on an invalid file: the file as it stands counts, loudly.

100 saves as fast as the test can make them, valid (a new description) and invalid in turn, the
last one invalid: the servers keep the last config applied, and the refusal says how many
changes of the file it stands for (`file_changes`, and `veloxd status`), so the valid versions
are not dropped without a word. Saving a valid file then applies it, without restarting anyone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.fixtures.daemon_harness import DaemonHarness, entry, to_yaml
from tests.support import free_port, wait_until

INVALID = "version: 1\nservers:\n  alpha: {model: 3, port: -1}\n"


def test_burst_ending_invalid_keeps_the_servers_and_says_how_many_changes(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    servers = {"alpha": entry(free_port())}
    h.write(servers)
    try:
        h.start()
        h.wait_states({"alpha": "ready"})
        before = h.state()
        pid = before["servers"]["alpha"]["pid"]
        mark = h.mark()
        for i in range(100):
            if i % 2 == 0:
                servers["alpha"]["description"] = f"version {i}"
                h.write(servers)
            else:
                h.write(INVALID)
        final_sha = hashlib.sha256(INVALID.encode()).hexdigest()
        failed = h.wait_event("config_reload_failed", after=mark, config_sha256=final_sha)
        applied = [r for r in h.records()[mark:] if r["event"] == "config_reloaded"]
        if applied:  # a slow machine let the 2 s cap of the debounce fall inside the burst
            assert failed["kept_config_sha256"] == applied[-1]["config_sha256"]
            assert failed["file_changes"] >= 1
        else:  # the usual case: one verdict for the whole burst, on the file as it stands
            assert failed["kept_config_sha256"] == before["config_sha256"]
            assert failed["file_changes"] >= 50, failed["file_changes"]
        status = h.cli("status")
        assert status.returncode == 3  # a refused reload
        assert "FAILED, kept the last good config" in status.stdout
        assert f"{failed['file_changes']} changes of the file merged: only its content now counts" in status.stdout
        assert h.server("alpha")["pid"] == pid  # served on throughout

        mark = h.mark()
        servers["alpha"]["description"] = "the fixed file"
        h.write(servers)
        reloaded = h.wait_event("config_reloaded", after=mark)
        assert reloaded["config_sha256"] == hashlib.sha256(to_yaml(servers).encode()).hexdigest()

        # the state file is written at the end of the loop turn that logged the event: wait for it
        def fixed_in_state() -> bool:
            return h.state()["config"]["servers"]["alpha"]["description"] == "the fixed file"

        wait_until(fixed_in_state, 60, what="the fixed file in the state file")
        assert h.server("alpha")["pid"] == pid
        assert h.cli("status").returncode == 0
    finally:
        h.cleanup()
