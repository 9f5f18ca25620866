"""A burst of edits ending on an invalid file: the file as it stands counts, loudly.

100 saves as fast as the test can make them, valid (a new description) and invalid in turn, the
last one invalid: the servers keep the last config applied, and the refusal says how many
changes of the file it stands for (`file_changes`, and `veloxd status`), so the valid versions
are not dropped without a word. Saving a valid file then applies it, without restarting anyone.

Usually the whole burst gets one verdict. On a busy machine the debounce's 2 s cap can fall
inside it, on a valid version (applied) or an invalid one (refused, the rest of the burst then
`config_unchanged` or refused again): every verdict carries its `file_changes`, so together they
account for the burst, and the last refusal is what status shows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.fixtures.daemon_harness import DaemonHarness, entry, to_yaml
from tests.support import free_port, wait_until

INVALID = "version: 1\nservers:\n  alpha: {model: 3, port: -1}\n"
VERDICTS = ("config_reloaded", "config_reload_failed", "config_unchanged")


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

        def verdicts() -> list[dict]:
            return [r for r in h.records()[mark:] if r["event"] in VERDICTS]

        def accounted() -> int:
            return sum(r["file_changes"] for r in verdicts())

        wait_until(lambda: accounted() >= 50, 60, what="verdicts standing for the burst's changes")
        h.wait_event("config_reload_failed", after=mark, config_sha256=final_sha)

        def shown_refusal() -> tuple[dict, str] | None:
            """The last refusal of the file as it stands, once status shows it (a verdict may still come)."""
            failed = [r for r in verdicts() if r["event"] == "config_reload_failed"][-1]
            status = h.cli("status")
            burst = f"{failed['file_changes']} changes of the file merged: only its content now counts"
            shown = status.returncode == 3 and (failed["file_changes"] <= 1 or burst in status.stdout)
            return (failed, status.stdout) if shown and failed["config_sha256"] == final_sha else None

        failed, status_text = wait_until(shown_refusal, 60, what="status showing the burst's refusal")
        assert "FAILED, kept the last good config" in status_text
        applied = [r for r in verdicts() if r["event"] == "config_reloaded"]
        # the config kept is the last one applied: before the burst, or a valid version within it
        assert failed["kept_config_sha256"] == (applied[-1] if applied else before)["config_sha256"]
        if len(verdicts()) == 1:  # the usual case: one verdict for the whole burst
            assert failed["file_changes"] >= 50, failed["file_changes"]
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
