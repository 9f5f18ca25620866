"""How `veloxd status` shows a distributed entry, and the group's kv_memory as a labelled sum.

The status text is rendered from a state file as the daemon writes it (the daemon test checks a
real one); here the states a test cannot catch in passing: a group still starting, which has not
reported its ranks, next to a ready one.
"""

from __future__ import annotations

from veloxd.config.sections import Distributed
from veloxd.daemon.views import render_status
from veloxd.distributed.command import group_status
from veloxd.distributed.kv_figures import group_kv_memory

HOSTS = ("127.0.0.1", "10.0.0.2")


def ready_payload(pids: list[int]) -> dict:
    ranks = [{"rank": i, "pid": pid, "host": host} for i, (pid, host) in enumerate(zip(pids, HOSTS, strict=True))]
    return {"distributed": {"ranks": ranks}}


def server(state: str, group: dict | None) -> dict:
    return {"state": state, "pid": 10, "port": 8081, "method": "kivi", "distributed": group}


def test_status_shows_each_rank_once_ready_and_the_hosts_while_starting() -> None:
    block = Distributed(hosts=HOSTS)
    ready = group_status(block, "ready", ready_payload([101, 202]))
    starting = group_status(block, "starting", None)
    assert ready is not None and starting is not None
    assert ready["ranks"] == [{"rank": 0, "pid": 101, "host": HOSTS[0]}, {"rank": 1, "pid": 202, "host": HOSTS[1]}]
    assert starting["ranks"] is None and starting["hosts"] == list(HOSTS) and starting["world_size"] == 2
    text = render_status(
        {
            "servers": {
                "big": server("ready", ready),
                "next": server("starting", starting),
                "solo": server("ready", None),
            }
        }
    )
    assert (
        "big: group of 2 ranks (ring, tensor), ready: rank 0 pid 101 on 127.0.0.1, rank 1 pid 202 on 10.0.0.2" in text
    )
    assert "next: group of 2 ranks (ring, tensor), starting; ranks not reported yet (hosts 127.0.0.1, 10.0.0.2)" in text
    assert "solo: group" not in text
    assert group_status(None, "ready", None) is None  # a plain entry carries no group


def figure(per_token: float, fixed: int, at_4k: int, cap: int | None = None) -> dict:
    return {
        "fixed_bytes": {"method": fixed, "fp16": 0},
        "bytes_per_token": {"method": per_token, "fp16": 2048.0},
        "eviction_cap_tokens": [cap] if cap else None,
        "max_context": 8192,
        "at": {"4096": {"method": at_4k, "fp16": 2048 * 4096, "ratio": round(at_4k / (2048 * 4096), 4)}},
        "probe_tokens": [256, 512],
        "source": "measured",
    }


def test_group_kv_memory_sums_the_ranks_and_says_so() -> None:
    group = group_kv_memory([figure(576.0, 10, 2_359_296, 64), figure(577.5, 12, 2_365_440)])
    assert group["bytes_per_token"] == {"method": 1153.5, "fp16": 4096.0}
    assert group["fixed_bytes"] == {"method": 22, "fp16": 0}
    assert group["at"]["4096"] == {
        "method": 4_724_736,
        "fp16": 2 * 2048 * 4096,
        "ratio": round(4_724_736 / (2 * 2048 * 4096), 4),
    }
    assert group["eviction_cap_tokens"] == [64] and group["max_context"] == 8192
    assert group["summed_over_ranks"] == 2 and group["source"].startswith("sum over 2 ranks")
