"""The daemon runs a distributed entry as one unit: one group process (MLX's launcher) and its ranks.

One test walks the whole life of a 2-rank entry next to a plain one, because every model load
costs tens of seconds here: ready with every rank's output in the log tagged by rank; a killed
rank takes the group through backoff and every rank restarts; an edit of the entry restarts the
group and leaves the other entry alone; SIGKILL of the daemon leaves no rank alive.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.distributed.support import ASSET_MODEL, LOAD_S, LOCAL_PAIR, children, ring_port
from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_gone
from tests.support import free_port, http_json


def rank_pids(ready: dict) -> list[int]:
    return [r["pid"] for r in ready["ready"]["distributed"]["ranks"]]


@pytest.mark.slow
def test_a_distributed_entry_is_supervised_as_one_unit(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path, real_worker=True)
    group = entry(
        free_port(),
        model=str(ASSET_MODEL),
        method="fp16",  # supervision is the point here; methods per rank: test_distributed_serve.py
        ready_timeout_s=LOAD_S,
        stop_timeout_s=30,
        distributed={"hosts": LOCAL_PAIR, "port": ring_port()},
    )
    solo = entry(free_port(), model=str(ASSET_MODEL), method="fp16", ready_timeout_s=LOAD_S)
    h.write({"group": group, "solo": solo})
    try:
        h.start()
        up = h.wait_states({"group": "ready", "solo": "ready"}, timeout=LOAD_S)
        ready = h.events("server_ready", server="group")[-1]
        ranks = rank_pids(ready)
        assert ranks[0] == ready["ready"]["pid"] and sorted(ranks) == sorted(children(up["group"]["pid"]))
        assert http_json(f"http://127.0.0.1:{group['port']}/health", timeout=10)[0] == 200
        status, body = http_json(
            f"http://127.0.0.1:{group['port']}/v1/completions",
            {"prompt": "The house", "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        assert status == 200 and body["choices"][0]["text"].strip()
        shown = json.loads(h.cli("status", "--json").stdout)["servers"]["group"]["distributed"]
        assert shown["state"] == "ready" and shown["world_size"] == 2
        assert [(r["rank"], r["pid"], r["host"]) for r in shown["ranks"]] == [
            (0, ranks[0], LOCAL_PAIR[0]),
            (1, ranks[1], LOCAL_PAIR[1]),
        ]
        text = h.cli("status").stdout
        assert (
            f"group: group of 2 ranks (ring, tensor), ready: rank 0 pid {ranks[0]} on 127.0.0.1, rank 1 pid {ranks[1]}"
            in text
        )
        assert "solo: group of" not in text  # a plain entry has no group line
        for rank in (0, 1):  # every rank's own output reaches the JSON log, tagged
            assert h.events("server_output", server="group", rank=rank), rank
        assert not any(r.get("line", "").startswith("[rank") for r in h.events("server_output", server="group"))

        mark = h.mark()
        os.kill(ranks[1], signal.SIGKILL)
        backoff = h.wait_event("server_backoff", after=mark, server="group", timeout=60)
        assert backoff["reason"] == "exited"
        again = h.wait_event("server_ready", after=mark, server="group", timeout=LOAD_S)
        wait_gone(ranks, 30)
        assert not set(rank_pids(again)) & set(ranks)
        assert h.server("solo")["pid"] == up["solo"]["pid"]

        mark = h.mark()
        h.write({"group": {**group, "distributed": {"hosts": LOCAL_PAIR, "port": ring_port()}}, "solo": solo})
        reloaded = h.wait_event("config_reloaded", after=mark, timeout=30)
        assert reloaded["plan"]["changed"] == {"group": ["distributed.port"]}
        edited = h.wait_event("server_ready", after=mark, server="group", timeout=LOAD_S)
        wait_gone(rank_pids(again), 30)
        assert h.server("solo")["pid"] == up["solo"]["pid"] and h.server("solo")["state"] == "ready"

        h.wait_states({"group": "ready", "solo": "ready"})
        everything = [h.server("group")["pid"], *rank_pids(edited), h.server("solo")["pid"]]
        assert all(pid_alive(p) for p in everything)
        h.signal(signal.SIGKILL)
        assert h.proc is not None
        h.proc.wait(10)
        wait_gone(everything, 45)  # the lifeline: group process and ranks, not just the plain worker
    finally:
        h.cleanup()
