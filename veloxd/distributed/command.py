"""The command line of a distributed entry's group process (no MLX import: the daemon uses it).

The daemon spawns ONE process per entry, as for any other entry: `python -m
veloxd.distributed.launcher` with MLX's launcher flags, then `--`, then the rank command
(`veloxd serve ... --distributed tensor --lifeline-fd 0`) that MLX's launcher starts on every host.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from veloxd.distributed.hostfile import parse_hostfile
from veloxd.distributed.rank_lines import split_rank

__all__ = ["describe", "group_argv", "rank_count", "split_rank"]


def rank_count(block: Any) -> int:
    """How many ranks the block names (0 when its hostfile cannot be read any more)."""
    if block.hosts is not None:
        return len(block.hosts)
    try:
        from pathlib import Path

        return len(parse_hostfile(Path(block.hostfile))[0])
    except ValueError:
        return 0


def describe(block: Any) -> str:
    """e.g. "2 ranks (ring, tensor)"."""
    return f"{rank_count(block)} ranks ({block.backend}, {block.parallelism})"


def group_argv(entry: Any, worker_command: Sequence[str], lifeline_fd: int) -> list[str]:
    """The group process's argv for `entry` (whose `distributed` is set)."""
    block = entry.distributed
    rank_command = list(worker_command)
    if block.python is not None:
        rank_command[0] = block.python
    rank_command += [*entry.serve_argv(), "--distributed", block.parallelism, "--lifeline-fd", "0"]
    argv = [
        sys.executable,
        "-m",
        "veloxd.distributed.launcher",
        "--lifeline-fd",
        str(lifeline_fd),
        "--backend",
        block.backend,
        "--starting-port",
        str(block.port),
    ]
    argv += ["--hosts", ",".join(block.hosts)] if block.hosts is not None else ["--hostfile", block.hostfile]
    if block.cwd is not None:
        argv += ["--cwd", block.cwd]
    for name, value in {"PYTHONUNBUFFERED": "1", **block.env}.items():
        argv += ["--env", f"{name}={value}"]
    return [*argv, "--", *rank_command]
