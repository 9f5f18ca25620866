"""Config rules of a `distributed:` block that the schema cannot express (no MLX import).

Each problem is reported against the key it is about, e.g. ("distributed", "hosts", 1).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from veloxd.config.sections import Distributed
from veloxd.distributed.hostfile import Rank, parse_hostfile, ranks_from_hosts

LOCAL = "127.0.0.1"  # the one name MLX's launcher starts without ssh
Report = Callable[[tuple, str], None]
PIPELINE_NEEDS_FP16 = (
    "pipeline parallelism serves only method fp16: mlx_lm 0.32 chains each pipeline stage's "
    "send to its last layer's fp16 cache (`cache.keys`), which a compressed cache does not "
    "expose; use parallelism: tensor for a compressed cache"
)


def is_this_machine(address: str) -> bool:
    """True when `address` is loopback or an address of one of this machine's interfaces."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))  # the kernel accepts only its own addresses
        except OSError:
            return False
    return True


def check_distributed(data: dict[str, Any], base_dir: Path, report: Report) -> None:
    """Check (and normalise in place: hostfile made absolute) `data["distributed"]` of one entry."""
    block = dict(data["distributed"])
    data["distributed"] = block
    where = ("distributed",)
    hosts: Any = block.get("hosts")
    hostfile = block.get("hostfile")
    if (hosts is None) == (hostfile is None):
        report(where, "distributed needs exactly one of hosts (a list of addresses) or hostfile (an MLX hostfile)")
        return
    backend = block.get("backend", Distributed.backend)
    if hostfile is not None:
        path = Path(os.path.normpath(base_dir / os.path.expanduser(hostfile)))
        block["hostfile"] = str(path)
        try:
            ranks, named_backend = parse_hostfile(path)
        except ValueError as err:
            report(where + ("hostfile",), str(err))
            return
        if named_backend and named_backend != backend:
            report(where + ("backend",), f"backend {backend} differs from the hostfile's backend {named_backend}")
        at: tuple = where + ("hostfile",)
        if len(ranks) < 2:
            report(at, f"hostfile {path} lists {len(ranks)} host; a distributed server needs at least 2")
            return
    else:
        ranks, at = ranks_from_hosts(hosts), where + ("hosts",)
        if backend == "jaccl":
            report(
                where + ("backend",),
                "backend jaccl needs a hostfile with the RDMA devices "
                "(write one with mlx.distributed_config), not a hosts list",
            )
            return
    _check_ranks(ranks, backend, at, hostfile is None, report)
    for name in ("python", "cwd"):
        value = block.get(name)
        if value is not None and not value.startswith("/"):
            report(where + (name,), f"distributed.{name} must be an absolute path (it names a path on every host)")
    if block.get("parallelism") == "pipeline" and data.get("method", "fp16") != "fp16":
        report(where + ("parallelism",), PIPELINE_NEEDS_FP16)
    if data.get("adapter_path") is not None:
        report(where, "mlx_lm loads no LoRA adapter on a sharded model: remove adapter_path or distributed")
    _check_model_shards(
        str(data.get("model", "")), len(ranks), block.get("parallelism", Distributed.parallelism), at, report
    )


def _check_ranks(ranks: list[Rank], backend: str, at: tuple, listed: bool, report: Report) -> None:
    def place(index: int) -> tuple:
        return at + (index,) if listed else at

    first = ranks[0]
    if first.ssh != LOCAL and not is_this_machine(first.ssh) and not any(is_this_machine(ip) for ip in first.ips):
        report(
            place(0),
            f"rank 0 ({first.ssh}) must be this machine: it serves the HTTP API the daemon checks and clients call",
        )
    if backend == "ring":
        for index, rank in enumerate(ranks):
            if not rank.ips:
                report(
                    place(index),
                    f"the ring backend needs an IP address for rank {index}, not the name "
                    f"{rank.ssh!r} (MLX's launcher connects the ranks by address)",
                )
        remote = any(r.ssh != LOCAL for r in ranks[1:])
        if remote and first.ips and ipaddress.ip_address(first.ips[0]).is_loopback:
            report(
                place(0),
                "rank 0 is reachable only on loopback, but other ranks run on other machines: use a "
                'hostfile with {"ssh": "127.0.0.1", "ips": [<this Mac\'s address>]} for rank 0',
            )
    elif backend == "jaccl":
        n = len(ranks)
        for index, rank in enumerate(ranks):
            if len(rank.rdma) != n or rank.rdma[index] is not None:
                report(
                    place(index),
                    f"jaccl: host {index} needs 'rdma' with {n} entries, null at its own "
                    "position (mlx.distributed_config writes them)",
                )
        if not first.ips:
            report(place(0), "jaccl: rank 0 needs an IP address the other ranks can reach (its 'ips')")


def _check_model_shards(model: str, ranks: int, parallelism: str, at: tuple, report: Report) -> None:
    """What a local model's config.json tells before any weight loads; an HF id is checked by the worker."""
    config_file = Path(model) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    config = {**config, **(config.get("text_config") or {})}
    if parallelism == "tensor":
        for key in ("num_attention_heads", "num_key_value_heads"):
            heads = config.get(key)
            if isinstance(heads, int) and heads % ranks:
                report(
                    at,
                    f"tensor parallelism splits the heads evenly: {key}={heads} of {config_file} "
                    f"does not divide by {ranks} ranks (use a rank count that divides it, or pipeline)",
                )
                return
    else:
        layers = config.get("num_hidden_layers")
        if isinstance(layers, int) and layers < ranks:
            report(at, f"pipeline parallelism needs a layer per rank: {config_file} has {layers} for {ranks} ranks")
        if not (Path(model) / "model.safetensors.index.json").is_file():
            report(
                at,
                f"pipeline parallelism loads each rank's layers through model.safetensors.index.json, "
                f"which {model} lacks (use tensor, or a checkpoint saved by mlx_lm.convert)",
            )


def port_conflicts(raw_servers: dict[str, Any]) -> list[tuple[str, str]]:
    """(server, message) for a distributed entry whose ranks' ports collide with another entry's ports.

    Ranks on one machine (loopback tests, or several ranks per Mac) listen on port .. port + ranks - 1;
    the check is conservative and treats every rank as local.
    """
    taken: list[tuple[str, int, int]] = []  # (server, first, last)
    for name, raw in raw_servers.items():
        if isinstance(raw, dict) and isinstance(raw.get("port"), int):
            taken.append((name, raw["port"], raw["port"]))
    conflicts = []
    for name, raw in raw_servers.items():
        block = raw.get("distributed") if isinstance(raw, dict) else None
        if not isinstance(block, dict) or not isinstance(block.get("hosts"), list):
            continue
        first = block.get("port", Distributed.port)
        if not isinstance(first, int):
            continue
        last = first + len(block["hosts"]) - 1
        for other, low, high in taken:
            if low <= last and first <= high:
                whose = "this server's own port" if other == name else f"server '{other}'"
                ports = f"{low}-{high}" if high != low else str(low)
                conflicts.append(
                    (
                        name,
                        f"distributed.port: the ranks listen on {first}-{last}, which overlaps port {ports} of {whose}",
                    )
                )
                break
        taken.append((name, first, last))
    return conflicts
