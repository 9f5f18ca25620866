"""Output lines of a distributed group, tagged with the rank that wrote them.

The group process (`launcher`) writes every complete line of rank N as `[rank N] <line>`; its
own lines carry no tag. The daemon splits the tag off to log `server_output` with `rank`.
"""

from __future__ import annotations

import re

_TAGGED = re.compile(r"^\[rank (\d{1,4})\] ?(.*)$", re.DOTALL)


def tag(rank: int, line: str) -> str:
    return f"[rank {rank}] {line}"


def split_rank(line: str) -> tuple[int | None, str]:
    """(rank, text) of a tagged line; (None, line) for the launcher's own lines."""
    match = _TAGGED.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), match.group(2)
