"""Shared helpers of the distributed tests: a 2-rank group on loopback, and process lookups."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support import READY_PREFIX, REPO, free_port, wait_until

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


class Group:
    """`python -m veloxd.distributed.launcher` running 2 local ranks of `veloxd serve --distributed`."""

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
            sys.executable,
            "-m",
            "veloxd",
            "serve",
            *serve_args,
            "--distributed",
            parallelism,
            "--lifeline-fd",
            "0",
        ]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._drains = [
            threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
        ]
        for drain in self._drains:
            drain.start()

    @staticmethod
    def _drain(stream: Any, sink: list[str]) -> None:
        with stream:  # closed at EOF: the group process and every rank are gone
            for line in stream:
                sink.append(line.rstrip("\n"))

    def ready(self, timeout: float = LOAD_S) -> dict[str, Any]:
        import json

        def payload() -> dict[str, Any] | None:
            for line in self.stdout:
                if line.startswith("[rank 0] " + READY_PREFIX):
                    return json.loads(line[len("[rank 0] " + READY_PREFIX) :])
            if self.proc.poll() is not None:
                raise AssertionError(f"group exited {self.proc.returncode}: {self.stderr[-30:]}")
            return None

        return wait_until(payload, timeout, what="the group's READY line")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            code = self.proc.wait(10)
        for drain in self._drains:
            drain.join(timeout)
        return code


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
