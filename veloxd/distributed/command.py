"""The command line of a distributed entry's group process (no MLX import: the daemon uses it).

The daemon spawns ONE process per entry, as for any other entry: `python -m
veloxd.distributed.launcher` with MLX's launcher flags, then `--`, then the rank command
(`veloxd serve --entry-json DOC --lifeline-fd 0`, DOC naming the parallelism as `distributed`) that
MLX's launcher starts on every host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from veloxd.distributed.hostfile import parse_hostfile
from veloxd.distributed.rank_lines import split_rank
from veloxd.launch import module_argv
from veloxd.protocol import LIFELINE_FLAG

__all__ = ["describe", "group_argv", "group_status", "rank_count", "split_rank"]


def rank_count(block: Any) -> int:
    """How many ranks the block names (0 when its hostfile cannot be read any more)."""
    if block.hosts is not None:
        return len(block.hosts)
    try:
        from pathlib import Path

        return len(parse_hostfile(Path(block.hostfile))[0])
    except ValueError:
        return 0


def configured_hosts(block: Any) -> list[str]:
    """Each rank's ssh destination as configured (rank 0 first; [] when the hostfile cannot be read)."""
    if block.hosts is not None:
        return list(block.hosts)
    try:
        from pathlib import Path

        return [rank.ssh for rank in parse_hostfile(Path(block.hostfile))[0]]
    except ValueError:
        return []


def group_status(block: Any, state: str, ready: dict[str, Any] | None) -> dict[str, Any] | None:
    """What `veloxd status` shows of a distributed entry (None for any other): the group's state,
    its configuration, and each rank's pid and host as its READY line reported them (ranks: null
    until the group is ready: a starting or restarting group has not reported its ranks)."""
    if block is None:
        return None
    reported = ((ready or {}).get("distributed") or {}).get("ranks")
    ranks = None
    if isinstance(reported, list):
        ranks = [{"rank": r.get("rank"), "pid": r.get("pid"), "host": r.get("host")} for r in reported]
    return {
        "state": state,
        "world_size": rank_count(block),
        "backend": block.backend,
        "parallelism": block.parallelism,
        "hosts": configured_hosts(block),
        "ranks": ranks,
    }


def describe(block: Any) -> str:
    """e.g. "2 ranks (ring, tensor)"."""
    return f"{rank_count(block)} ranks ({block.backend}, {block.parallelism})"


def group_argv(entry: Any, worker_command: Sequence[str], lifeline_fd: int) -> list[str]:
    """The group process's argv for `entry` (whose `distributed` is set)."""
    block = entry.distributed
    rank_command = list(worker_command)
    if block.python is not None:
        rank_command[0] = block.python
    rank_command += [*entry.serve_argv(), LIFELINE_FLAG, "0"]  # the document says --distributed
    argv = module_argv(
        "veloxd.distributed.launcher",
        "--lifeline-fd",
        str(lifeline_fd),
        "--backend",
        block.backend,
        "--starting-port",
        str(block.port),
    )
    argv += ["--hosts", ",".join(block.hosts)] if block.hosts is not None else ["--hostfile", block.hostfile]
    if block.cwd is not None:
        argv += ["--cwd", block.cwd]
    for name, value in {"PYTHONUNBUFFERED": "1", **block.env}.items():
        argv += ["--env", f"{name}={value}"]
    return [*argv, "--", *rank_command]
