"""Checks the schema cannot express (paths, hosts, exposure, cross-field and cross-entry rules), then the entries."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from veloxd.checks import host_problem, is_loopback, parse_size, resolve_model
from veloxd.config.keys import size_paths
from veloxd.config.kv_checks import kv_error_path, kv_problems
from veloxd.config.model import ServerEntry
from veloxd.config.sections import Dashboard, RestartPolicy
from veloxd.endpoints import WILDCARDS
from veloxd.kv.config import KVConfigError

Problems = list[tuple[tuple, str]]  # (path inside the entry, message)
Report = Callable[[tuple, str], None]


def check_entry(
    name: str, raw: dict[str, Any], base_dir: Path, refused: AbstractSet[tuple] = frozenset()
) -> tuple[ServerEntry | None, Problems]:
    """The entry built from `raw`, or None and the reasons it cannot be built.

    `refused` holds the paths inside the entry that already failed the schema: they are not checked
    again, and no entry is built. Every other check still runs, so `check` shows every mistake at once.
    """
    bad_keys = {path[0] for path in refused if path}
    problems: Problems = kv_problems(raw, refused)

    def report(path: tuple, message: str) -> None:
        problems.append((path, message))

    data = dict(raw)
    if "model" in data and "model" not in bad_keys:
        data["model"] = _resolve_model(data["model"], base_dir, report)
    if data.get("adapter_path") is not None and "adapter_path" not in bad_keys:
        data["adapter_path"] = _resolve_path(data["adapter_path"], base_dir)
    if not bad_keys & {"host", "api_key_env", "allow_unauthenticated"}:
        _check_host(data, report)
    if "restart" not in bad_keys:
        _check_backoff(data.get("restart") or {}, report)
    check_sizes(data, ServerEntry, bad_keys, report)
    if not bad_keys & {"sampling", "limits"}:
        _check_token_cap(data, report)
    if data.get("distributed") is not None and not bad_keys & {"distributed", "model", "adapter_path"}:
        from veloxd.distributed.checks import check_distributed

        check_distributed(data, base_dir, report)
    if problems or bad_keys:
        return None, problems
    try:
        return ServerEntry.from_dict(name, data), []
    except KVConfigError as err:  # a backstop: kv_problems ran the same rules first
        return None, [(kv_error_path(err.field, data), err.message)]


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
    host, port = raw.get("host", Dashboard.host), raw.get("port", Dashboard.port)
    if not is_loopback(host):
        problems.append(
            (
                ("host",),
                f"dashboard host {host} is not a loopback address: the dashboard shows logs "
                "and states without authentication, so it binds 127.0.0.1, ::1 or localhost",
            )
        )
    for other, (other_host, other_port) in servers.items():
        if port == other_port and _same_address(host, other_host):
            problems.append((("port",), f"dashboard {host}:{port} is already used by server '{other}'"))
            break
    return problems


def _same_address(a: str, b: str) -> bool:
    """Equal after normalising, or one of them is a wildcard (0.0.0.0 / ::) that takes every address."""

    def norm(host: str) -> str:
        host = host.lower()
        try:
            return str(ipaddress.ip_address("127.0.0.1" if host == "localhost" else host))
        except ValueError:
            return host

    return norm(a) == norm(b) or norm(a) in WILDCARDS or norm(b) in WILDCARDS


def _resolve_model(text: str, base_dir: Path, report: Report) -> str:
    """Local directory (absolute, normalised) or Hugging Face id, as mlx_lm decides: an existing path wins.

    Whether a local path exists (or holds a model yet) is a fact of the world, not of the file:
    veloxd.config.world reports it, and the daemon makes only that entry wait.
    """
    ref = resolve_model(text, base_dir)
    if ref.problem and not ref.local:  # neither a path nor a well-formed id: the file is wrong
        report(("model",), ref.problem)
    return ref.value


def _resolve_path(text: str, base_dir: Path) -> str:
    return str(Path(os.path.normpath(base_dir / os.path.expanduser(text))))


def _check_backoff(restart: dict[str, Any], report: Report) -> None:
    initial = restart.get("backoff_initial_s", RestartPolicy.backoff_initial_s)
    longest = restart.get("backoff_max_s", RestartPolicy.backoff_max_s)
    if initial > longest:
        where = "backoff_max_s" if "backoff_max_s" in restart else "backoff_initial_s"
        report(("restart", where), f"restart.backoff_max_s ({longest}) must be at least backoff_initial_s ({initial})")


def check_sizes(data: dict[str, Any], cls: type, bad_keys: AbstractSet[str], report: Report, label: str = "") -> None:
    """Each size key of `cls` given in `data` parses (the schema checks only its pattern); `label`
    prefixes the key in the message. Keys under a top-level key in `bad_keys` are not checked again."""
    for path in size_paths(cls):
        if path[0] in bad_keys:
            continue
        value: Any = data
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            try:
                parse_size(value)
            except ValueError as err:
                report(path, f"{label}{'.'.join(path)}: {err}")


def _check_host(data: dict[str, Any], report: Report) -> None:
    host = data.get("host", ServerEntry.host)
    problem = host_problem(host)
    if problem:
        report(("host",), f"host={problem}")
        return
    if not is_loopback(host) and not data.get("api_key_env") and data.get("allow_unauthenticated") is not True:
        report(
            ("host",),
            f"host {host} exposes the server beyond this machine: set api_key_env (clients then "
            "need a bearer token) or, deliberately, allow_unauthenticated: true",
        )


def _check_token_cap(data: dict[str, Any], report: Report) -> None:
    default = (data.get("sampling") or {}).get("max_tokens")
    cap = (data.get("limits") or {}).get("max_tokens")
    if isinstance(default, int) and isinstance(cap, int) and default > cap:
        report(
            ("sampling", "max_tokens"),
            f"sampling.max_tokens ({default}) exceeds limits.max_tokens ({cap}): no request could get it",
        )
