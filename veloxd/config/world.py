"""Facts of the world an entry needs at the moment it starts, as opposed to the validity of the file.

A model path that does not exist *yet*, an adapter still being copied, a host name that does not
resolve yet (or an address the machine does not have yet), a port another process holds, an
unset `api_key_env` variable: none of these makes veloxd.yaml wrong, and each can clear by itself. The loader reports them as warnings (`veloxd check`); the daemon puts only the
entry concerned in the WAITING state and looks again when a watch or its recheck schedule says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veloxd.checks import near_siblings
from veloxd.endpoints import cannot_listen_on, port_holder, port_in_use


@dataclass(frozen=True)
class Condition:
    """One unmet condition of an entry: where in the entry it comes from, and what is wrong."""

    kind: str  # "model_path" | "adapter_path" | "host" | "port" | "env" | "download"
    path: tuple[str, ...]  # the entry's key it concerns, e.g. ("model",)
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": ".".join(self.path), "message": self.message}


def local_path(model: str) -> Path | None:
    """The model (or adapter) as a local path, or None for a Hugging Face id.

    The loader resolves every local path to an absolute one (an existing path, or one written
    as a path: /, ./, ../, ~), so anything relative left here is an id.
    """
    path = Path(model).expanduser()
    return path if path.is_absolute() else None


def model_problem(path: Path) -> str | None:
    if not path.exists():
        return f"model path {path} does not exist (yet){near_siblings(path)}"
    if not path.is_dir():
        return f"model path {path} is a file; expected an MLX model directory"
    if not (path / "config.json").is_file():
        return f"model directory {path} has no config.json (not an MLX model directory, or still being copied)"
    return None


def adapter_problem(path: Path) -> str | None:
    if not path.exists():
        return f"adapter path {path} does not exist (yet)"
    if not path.is_dir():
        return f"adapter path {path} is not a directory"
    return None


def env_problem(variable: str, entry_env: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    if entry_env.get(variable) or environ.get(variable):
        return None
    return (
        f"api_key_env {variable} is not set (or empty) in the environment or the entry's env "
        "(the server would refuse every client)"
    )


def port_problem(host: str, port: int) -> str | None:
    if not port_in_use(host, port):
        return None
    holder = port_holder(port)
    return f"port {port} on {host} is already in use" + (f" by {holder}" if holder else "")


def entry_conditions(entry: Any, environ: Mapping[str, str] | None = None, *, ports: bool = True) -> list[Condition]:
    """Every unmet condition of `entry` (a ServerEntry) right now; [] when it can start.

    `ports=False` skips the port (for `veloxd check`, which runs next to the daemon whose own
    workers hold the ports), not the host: a name that does not resolve or an address that is not
    this machine's.
    """
    environ = os.environ if environ is None else environ
    found: list[Condition] = []
    model = local_path(entry.model) if entry.model else None  # the dashboard's entry has no model
    if model is not None and (problem := model_problem(model)):
        found.append(Condition("model_path", ("model",), problem))
    adapter = getattr(entry, "adapter_path", None)
    if adapter and (problem := adapter_problem(Path(adapter))):
        found.append(Condition("adapter_path", ("adapter_path",), problem))
    api_key_env = getattr(entry, "api_key_env", None)
    if api_key_env and (problem := env_problem(api_key_env, getattr(entry, "env", {}), environ)):
        found.append(Condition("env", ("api_key_env",), problem))
    if problem := cannot_listen_on(entry.host):
        found.append(Condition("host", ("host",), problem))
    elif ports and (problem := port_problem(entry.host, entry.port)):
        found.append(Condition("port", ("port",), problem))
    return found


def watched_paths(entry: Any) -> list[Path]:
    """The local paths an entry loads from (model, adapter): their appearance can clear a condition."""
    paths = [local_path(entry.model) if entry.model else None]
    if getattr(entry, "adapter_path", None):
        paths.append(Path(entry.adapter_path))
    return [p for p in paths if p is not None]
