"""Checks the schema cannot express (paths, hosts, exposure, cross-field and cross-entry rules), then the entries."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from veloxd.config.model import RestartPolicy, ServerEntry
from veloxd.config.units import parse_size

HF_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")

Problems = list[tuple[tuple, str]]  # (path inside the entry, message)
Report = Callable[[tuple, str], None]


def check_entry(name: str, raw: dict[str, Any], base_dir: Path,
                bad_keys: AbstractSet[str] = frozenset()) -> tuple[ServerEntry | None, Problems]:
    """The entry built from `raw`, or None and the reasons it cannot be built.

    Keys in `bad_keys` already failed the schema: they are not checked again, and no entry is built.
    """
    problems: Problems = []

    def report(path: tuple, message: str) -> None:
        problems.append((path, message))

    data = dict(raw)
    if "model" in data and "model" not in bad_keys:
        data["model"] = _resolve_model(data["model"], base_dir, report)
    if data.get("adapter_path") is not None and "adapter_path" not in bad_keys:
        data["adapter_path"] = _resolve_adapter(data["adapter_path"], base_dir, report)
    if not bad_keys & {"host", "api_key_env", "allow_unauthenticated"}:
        _check_host(data, report)
    if "restart" not in bad_keys:
        _check_backoff(data.get("restart") or {}, report)
    size = None if "prompt_cache" in bad_keys else (data.get("prompt_cache") or {}).get("bytes")
    if size is not None:
        try:
            parse_size(size)
        except ValueError as err:
            report(("prompt_cache", "bytes"), f"prompt_cache.bytes: {err}")
    if data.get("distributed") is not None and not bad_keys & {"distributed", "model", "adapter_path"}:
        from veloxd.distributed.checks import check_distributed

        check_distributed(data, base_dir, report)
    if problems or bad_keys:
        return None, problems
    try:
        return ServerEntry.from_dict(name, data), []
    except ValueError as err:  # KVCacheConfig's cross-field rules: point at the field the message names
        return None, [(_kv_error_path(str(err), data), str(err))]


def endpoint_conflicts(endpoints: dict[str, tuple[str, int]]) -> list[tuple[str, str]]:
    """(server, message) for every server whose host:port is already taken by an earlier one."""
    conflicts: list[tuple[str, str]] = []
    taken: list[tuple[str, tuple[str, int]]] = []
    for name, (host, port) in endpoints.items():
        for other, (other_host, other_port) in taken:
            if port == other_port and _same_address(host, other_host):
                also = "" if host == other_host else f" ({other_host}:{port})"
                conflicts.append((name, f"{host}:{port} is already used by server '{other}'{also}"))
                break
        taken.append((name, (host, port)))
    return conflicts


def check_dashboard(raw: dict[str, Any], servers: dict[str, tuple[str, int]]) -> Problems:
    """The `dashboard:` block: loopback only (it shows logs unauthenticated), a port of its own."""
    problems: Problems = []
    host, port = raw.get("host", "127.0.0.1"), raw.get("port", 8090)
    if not is_loopback(host):
        problems.append((("host",), f"dashboard host {host} is not a loopback address: the dashboard shows logs "
                                    "and states without authentication, so it binds 127.0.0.1, ::1 or localhost"))
    for other, (other_host, other_port) in servers.items():
        if port == other_port and _same_address(host, other_host):
            problems.append((("port",), f"dashboard {host}:{port} is already used by server '{other}'"))
            break
    return problems


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_address(a: str, b: str) -> bool:
    """Equal after normalising, or one of them is a wildcard (0.0.0.0 / ::) that takes every address."""
    def norm(host: str) -> str:
        host = host.lower()
        try:
            return str(ipaddress.ip_address("127.0.0.1" if host == "localhost" else host))
        except ValueError:
            return host
    return norm(a) == norm(b) or norm(a) in ("0.0.0.0", "::") or norm(b) in ("0.0.0.0", "::")


def _resolve_model(text: str, base_dir: Path, report: Report) -> str:
    """Local directory (absolute, normalised) or Hugging Face id, as mlx_lm decides: an existing path wins."""
    local = Path(os.path.normpath(base_dir / os.path.expanduser(text)))
    explicit = text.startswith(("/", "./", "../", "~")) or text in (".", "..")
    if local.exists():
        if not local.is_dir():
            report(("model",), f"model path {local} is a file; expected an MLX model directory")
        elif not (local / "config.json").is_file():
            report(("model",), f"model directory {local} has no config.json (not an MLX model directory)")
        return str(local)
    if explicit:
        report(("model",), f"model path {local} does not exist")
    elif not (HF_ID.match(text) and "--" not in text and ".." not in text):
        report(("model",), f"model '{text}' is neither an existing directory ({local}) "
                           "nor a Hugging Face id like 'mlx-community/Qwen2.5-7B-Instruct-4bit'")
    return text


def _resolve_adapter(text: str, base_dir: Path, report: Report) -> str:
    local = Path(os.path.normpath(base_dir / os.path.expanduser(text)))
    if not local.exists():
        report(("adapter_path",), f"adapter path {local} does not exist")
    elif not local.is_dir():
        report(("adapter_path",), f"adapter path {local} is not a directory")
    return str(local)


def _check_backoff(restart: dict[str, Any], report: Report) -> None:
    initial = restart.get("backoff_initial_s", RestartPolicy.backoff_initial_s)
    longest = restart.get("backoff_max_s", RestartPolicy.backoff_max_s)
    if initial > longest:
        where = "backoff_max_s" if "backoff_max_s" in restart else "backoff_initial_s"
        report(("restart", where), f"restart.backoff_max_s ({longest}) must be at least backoff_initial_s ({initial})")


def _check_host(data: dict[str, Any], report: Report) -> None:
    host = data.get("host", "127.0.0.1")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not HOSTNAME.match(host):
            report(("host",), f"host={host!r} is not a host name or IP address")
            return
    if not is_loopback(host) and not data.get("api_key_env") and data.get("allow_unauthenticated") is not True:
        report(("host",), f"host {host} exposes the server beyond this machine: set api_key_env (clients then "
                          "need a bearer token) or, deliberately, allow_unauthenticated: true")


def _kv_error_path(message: str, data: dict[str, Any]) -> tuple:
    first = re.match(r"\w+", message)
    name = first.group(0) if first else ""
    overrides = data.get("overrides") or {}
    if name in overrides:
        return ("overrides", name)
    if name in ("bits", "seed") and name in data:
        return (name,)
    return ("overrides",) if "overrides" in data else ("method",)
