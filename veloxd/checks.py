"""Value checks shared by the config loader (veloxd.yaml) and the worker's flags (`veloxd serve`).

One definition of each rule, so a value means the same wherever it is written:
- sizes: one unit rule (below), used for `prompt_cache.bytes`, `limits.max_body_bytes` and
  `veloxd serve --prompt-cache-bytes / --max-body-bytes`;
- hosts: host name or IP address, and which of them are loopback;
- Hugging Face ids and local model directories;
- "did you mean" suggestions for misspelled names.
Stdlib only: the daemon, `veloxd check` and the worker's pre-load validation import it freely.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

# ---- sizes --------------------------------------------------------------------------------
# The unit rule: K, M, G, T are decimal (powers of 1000, as disks and mlx_lm's own
# --prompt-cache-bytes help count); Ki, Mi, Gi, Ti are binary (powers of 1024). A trailing
# "B" changes nothing, case does not matter: "2G" = "2gb" = 2,000,000,000; "2Gi" = "2GiB" =
# 2,147,483,648. A bare integer is a number of bytes.
SIZE_FACTORS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?)?[bB]?\s*$"  # the JSON Schema form of the rule
SIZE_HELP = "an integer number of bytes or a string like '512M' or '2G' (decimal) or '1.5GiB' (binary)"
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(value: int | str) -> int:
    """Bytes for `value` under the unit rule above; ValueError naming the accepted forms otherwise."""
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
    size = int(number * SIZE_FACTORS[(match.group(2) or "").lower()])
    if size < 1:
        raise ValueError(f"'{value}' is not a size; it must be at least 1 byte")
    return size


def size_text(n: int) -> str:
    """`n` bytes in the unit rule's shortest exact form (what parse_size reads back): '32Mi', '2G', '100'."""
    for suffix, factor in sorted(SIZE_FACTORS.items(), key=lambda item: -item[1]):
        if factor > 1 and n % factor == 0:
            return f"{n // factor}{suffix[0].upper()}{suffix[1:]}"
    return str(n)


def gib(n: int | float | None) -> str:
    """Bytes as people read them in a table: '1.50 GiB', '12.0 MiB'."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


# ---- hosts --------------------------------------------------------------------------------
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")
HOST_PATTERN = r"^[A-Za-z0-9.:-]+$"  # the schema's coarse form; host_problem is the real check


def host_problem(host: str) -> str | None:
    """Why `host` is neither an IP address nor a host name, or None when it is one."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if all(label.isdigit() for label in host.split(".")):  # 999.1.1.1, 10.1: meant as an address
        return f"{host!r} is not a valid IP address"
    return None if HOSTNAME.match(host) else f"{host!r} is not a host name or IP address"


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach: localhost, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---- models -------------------------------------------------------------------------------
HF_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
HF_EXAMPLE = "mlx-community/Qwen2.5-7B-Instruct-4bit"


def is_hf_id(text: str) -> bool:
    """`owner/name` as the Hugging Face Hub accepts it (no '--' or '..' inside)."""
    return bool(HF_ID.match(text)) and "--" not in text and ".." not in text


@dataclass(frozen=True)
class ModelRef:
    """Where a `model` value points: `value` is an absolute directory or the HF id; `problem` why not usable."""

    value: str
    local: bool
    problem: str | None = None


def resolve_model(text: str, base_dir: Path | str) -> ModelRef:
    """A local MLX model directory or a Hugging Face id, as mlx_lm decides: an existing path wins.

    Relative paths resolve against `base_dir` (the config file's directory, or the worker's cwd);
    `~` expands. A path written explicitly (`/`, `./`, `../`, `~`) must exist.
    """
    local = Path(os.path.normpath(Path(base_dir) / os.path.expanduser(text)))
    explicit = text.startswith(("/", "./", "../", "~")) or text in (".", "..")
    if local.exists():
        if not local.is_dir():
            return ModelRef(str(local), True, f"model path {local} is a file; expected an MLX model directory")
        if not (local / "config.json").is_file():
            return ModelRef(
                str(local), True, f"model directory {local} has no config.json (not an MLX model directory)"
            )
        return ModelRef(str(local), True)
    if explicit:
        return ModelRef(str(local), True, f"model path {local} does not exist{near_siblings(local)}")
    if not is_hf_id(text):
        return ModelRef(
            text,
            False,
            f"model '{text}' is neither an existing directory ({local}) nor a Hugging Face id like '{HF_EXAMPLE}'",
        )
    return ModelRef(text, False)


# ---- names --------------------------------------------------------------------------------
def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest candidate, or "" when none is close."""
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def near_siblings(path: Path) -> str:
    """ "; did you mean '<dir>'?" for a directory beside a missing `path` with a close name, else ""."""
    try:
        siblings = [p.name for p in path.parent.iterdir() if p.is_dir()]
    except OSError:  # the parent is missing or unreadable too: nothing to suggest
        return ""
    close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6)
    return f"; did you mean '{path.parent / close[0]}'?" if close else ""
