"""Byte sizes as users write them ("2G", "512MiB", 1048576): parsing and the schema pattern."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# K/M/G/T are decimal, like mlx_lm's --prompt-cache-bytes; Ki/Mi/Gi/Ti are binary.
_FACTORS = {
    "": 1,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?)?[bB]?\s*$"
SIZE_HELP = "an integer number of bytes or a string like '512M' or '2G' (decimal) or '1.5GiB' (binary)"
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(value: int | str) -> int:
    """Bytes for `value`; ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; use {SIZE_HELP}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} is not a size; it must be at least 1 byte")
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"'{value}' is not a size; use {SIZE_HELP}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:  # the regex makes this unreachable, but never a traceback
        raise ValueError(f"'{value}' is not a size; use {SIZE_HELP}") from None
    size = int(number * _FACTORS[(match.group(2) or "").lower()])
    if size < 1:
        raise ValueError(f"'{value}' is not a size; it must be at least 1 byte")
    return size
