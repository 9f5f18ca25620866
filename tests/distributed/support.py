"""Shared helpers of the distributed tests: a 2-rank group on loopback, and process lookups."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.support import READY_PREFIX, REPO, Worker, free_port, veloxd_cmd, wait_until

LOAD_S = 240  # two or more model loads on two busy CPU cores
ASSET_MODEL = REPO / "veloxd" / "assets" / "tiny-llama"  # 4 query / 2 KV heads: splits over 2 ranks
LOCAL_PAIR = ["127.0.0.1", "127.0.0.1"]


def ring_port() -> int:
    """A base port whose successor is free too (rank r listens on base + r)."""

    def pair() -> int | None:
        base = free_port()
        return base if base < 65000 and _free(base + 1) else None

    return wait_until(pair, 10, what="two free ports")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Group(Worker):
    """`python -m veloxd.distributed.launcher` running 2 local ranks of `veloxd serve --distributed`."""

    ready_prefix = "[rank 0] " + READY_PREFIX  # the launcher tags every line with its rank

    def __init__(self, *serve_args: str, parallelism: str = "tensor", hosts: list[str] | None = None) -> None:
        argv = [
            sys.executable,
            "-m",
            "veloxd.distributed.launcher",
            "--backend",
            "ring",
            "--starting-port",
            str(ring_port()),
            "--hosts",
            ",".join(hosts or LOCAL_PAIR),
            "--env",
            "PYTHONUNBUFFERED=1",
            "--",
            *veloxd_cmd("serve", *serve_args),
            "--distributed",
            parallelism,
            "--lifeline-fd",
            "0",
        ]
        self._start(argv)

    def ready(self, timeout: float = LOAD_S) -> dict[str, Any]:
        return super().ready(timeout)


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; the ranks of a group process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found
