"""The daemon's download phase against the hub stand-in (workers are the fast stand-in worker):
progress events then ready, outside ready_timeout_s; a killed download continues; each failure
ends in its state with its reason; `veloxd status` shows the percentage."""

from __future__ import annotations

import http.server
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.download.conftest import GATED, MODEL, TINY
from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.fixtures.hub_standin import HubStandIn
from tests.support import free_port, wait_until
from veloxd.download import cache

WANTED = sum(p.stat().st_size for p in TINY.iterdir() if cache.wanted(p.name))
WEIGHTS = (TINY / "model.safetensors").stat().st_size
DEADLINE = 120
# Long enough for the stand-in worker to start on a loaded machine; the download is held longer than it.
READY_TIMEOUT_S = 8


@contextmanager
def tiny_daemon(hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path, **settings: Any) -> Iterator[DaemonHarness]:
    """A daemon with one entry, `tiny`, fetched from the stand-in; at the end the hub lets go of
    whatever it holds back, so that the daemon can stop."""
    h = DaemonHarness(tmp_path)
    h.write({"tiny": entry(free_port(), model=MODEL, **settings)})
    try:
        h.start(env=hub_env)
        yield h
    finally:
        hub.release()
        h.stop()
        h.cleanup()


def test_download_reports_progress_then_starts_outside_the_ready_timeout(
    hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path
) -> None:
    hub.rate_bps = 2_000_000
    hub.hold(3_000_000)  # wait half-way until `veloxd status` has been looked at and ready_timeout_s has passed
    with tiny_daemon(hub, hub_env, tmp_path, ready_timeout_s=READY_TIMEOUT_S) as h:
        h.wait_event("server_downloading", timeout=DEADLINE, server="tiny", state="downloading")
        began = time.monotonic()
        wait_until(
            lambda: ((h.server("tiny").get("download") or {}).get("done_bytes") or 0) >= 2_000_000,
            DEADLINE,
            what="2 MB reported",
        )
        shown = h.cli("status")
        assert re.search(r"^tiny\s+downloading (\d+)%", shown.stdout, re.M), shown.stdout
        assert f"tiny: downloading {MODEL}: " in shown.stdout and " MB of 8.3 MB" in shown.stdout
        time.sleep(max(0.0, began + READY_TIMEOUT_S - time.monotonic()))  # a lower bound, not a threshold
        hub.release()
        h.wait_states({"tiny": "ready"}, timeout=DEADLINE)
    names = [r["event"] for r in h.records() if r.get("server") == "tiny"]
    assert names.index("server_downloaded") < names.index("server_starting") < names.index("server_ready")
    assert "server_ready_timed_out" not in names and "server_backoff" not in names
    progress = [r for r in h.events("server_downloading", server="tiny") if "done_bytes" in r]
    assert len(progress) >= 2 and progress[-1]["total_bytes"] == WANTED
    assert [p["done_bytes"] for p in progress] == sorted(p["done_bytes"] for p in progress)
    assert all({"percent", "rate_bps", "eta_s"} <= p.keys() for p in progress)
    done = h.events("server_downloaded", server="tiny")[0]
    assert done["size_bytes"] == done["fetched_bytes"] == WANTED and done["resumed_from_bytes"] == 0
    assert done["download_s"] > READY_TIMEOUT_S  # longer than ready_timeout_s: the timeout did not count it
    assert h.events("server_starting", server="tiny")[0]["ready_timeout_s"] == READY_TIMEOUT_S


def test_a_killed_download_continues_where_it_stopped(hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path) -> None:
    hub.hold(3_000_000)
    with tiny_daemon(hub, hub_env, tmp_path) as h:
        wait_until(lambda: hub.served_bytes(MODEL, "model.safetensors") >= 3_000_000, DEADLINE, what="3 MB served")
        partial = wait_until(
            lambda: next(
                (p for p in Path(hub_env["HF_HOME"]).rglob("*.incomplete") if p.stat().st_size >= 1_500_000),
                None,
            ),
            DEADLINE,
            what="partial",
        )
        step = h.server("tiny")
        assert step["state"] == "downloading"
        os.killpg(step["pid"], signal.SIGKILL)
        failed = h.wait_event("server_download_failed", timeout=DEADLINE, server="tiny")
        assert failed["reason"] == "error" and "killed by SIGKILL" in failed["message"]
        kept = partial.stat().st_size
        first = hub.served_bytes(MODEL, "model.safetensors")  # the killed step received at least this much
        hub.release()
        h.wait_states({"tiny": "ready"}, timeout=DEADLINE)
    # Two transfers of the weights: from byte 0 (killed half-way), then from the kept part on.
    first_try, second_try = hub.transfers_of(MODEL, "model.safetensors")
    assert first_try.start == 0 and first_try.sent >= first >= kept
    assert second_try.start == kept and second_try.sent == WEIGHTS - kept < WEIGHTS
    done = h.events("server_downloaded", server="tiny")[-1]
    assert done["resumed_from_bytes"] >= kept and done["fetched_bytes"] < WANTED
    backoff = h.events("server_backoff", server="tiny")[0]
    assert backoff["reason"] == "download_failed" and backoff["from_state"] == "downloading"


def test_each_failure_gives_its_reason_and_state(hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path) -> None:
    """404 id, gated repo and offline are FATAL at once; too little disk and an unreachable hub are
    conditions of the world: those entries wait, saying why, and the unreachable one downloads and
    starts by itself once the hub answers (no edit, no `veloxd restart`)."""
    h = DaemonHarness(tmp_path)
    later = free_port()  # where the hub answers only later
    h.write(
        {
            "missing": entry(free_port(), model="tiny/nope"),
            "gated": entry(free_port(), model=GATED),
            "full": entry(free_port(), model=MODEL, env={"VELOXD_TEST_DISK_FREE_BYTES": "1000000"}),
            "offline": entry(free_port(), model=MODEL, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf2")}),
            "unreachable": entry(
                free_port(),
                model=MODEL,
                env={"HF_ENDPOINT": f"http://127.0.0.1:{later}", "HF_HOME": str(tmp_path / "hf3")},
            ),
        }
    )
    try:
        h.start(env=hub_env)
        fatal = dict.fromkeys(["missing", "gated", "offline"], "fatal")
        servers = h.wait_states({**fatal, "full": "waiting", "unreachable": "waiting"}, timeout=DEADLINE)
        status = h.cli("status").stdout
        h.wait_event(
            "server_waiting", timeout=DEADLINE, server="unreachable", after=h.mark()
        )  # a second look: still waiting
        # the state file is written at the end of the loop turn that logged the event: wait for it
        again = wait_until(lambda: s if (s := h.server("unreachable"))["state"] == "waiting" else None, DEADLINE)
        assert again["failures"] == 0 and again["restarts"] == 0
        back = http.server.ThreadingHTTPServer(("127.0.0.1", later), hub._server.RequestHandlerClass)  # the hub is back
        threading.Thread(target=back.serve_forever, daemon=True).start()
        try:
            h.wait_states({"unreachable": "ready"}, timeout=DEADLINE)
        finally:
            back.shutdown()
            back.server_close()
    finally:
        h.stop()
        h.cleanup()
    reasons = {name: s["fatal_reason"] for name, s in servers.items() if name in fatal}
    assert "has no model tiny/nope" in reasons["missing"] and "check `model:`" in reasons["missing"]
    assert f"{GATED} is a gated model" in reasons["gated"] and "HF_TOKEN" in reasons["gated"]
    assert "HF_HUB_OFFLINE" in reasons["offline"] and "veloxd pull" in reasons["offline"]
    for name, reason in reasons.items():
        assert f"{name}: {reason}" in status
    waits = {name: servers[name]["waiting_reason"] for name in ("full", "unreachable")}
    assert "not enough disk space for tiny/llama" in waits["full"] and "1.0 MB free" in waits["full"]
    assert waits["unreachable"].startswith(f"cannot reach http://127.0.0.1:{later}")
    for name, reason in waits.items():
        assert f"{name}: waiting: {reason}" in status
    for name in ("missing", "gated", "full", "offline", "unreachable"):  # no failure counted, no backoff
        assert not h.events("server_backoff", server=name), name
    assert not any(
        r.get("server") == n and r["event"] == "server_starting" for r in h.records() for n in ["full", *reasons]
    )  # no worker was started for them
    assert hub.served_bytes(GATED) == 0  # MODEL's files went out once each: to the healed entry alone
    keys = [t.key for t in hub.transfers]
    assert keys and len(keys) == len(set(keys)) and all(k.startswith(f"{MODEL}/") for k in keys), keys
