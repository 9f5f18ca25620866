"""MLX's hostfile format (what `mlx.distributed_config` writes and `mlx.launch --hostfile` reads).

Parsed here without importing MLX, so `veloxd check` can point at a malformed file. The format:
`{"backend": "...", "envs": [...], "hosts": [{"ssh": NAME, "ips": [IP, ...], "rdma": [...]}, ...]}`
or just the list of hosts.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Rank:
    ssh: str  # "127.0.0.1" runs the rank locally; anything else is an ssh destination
    ips: tuple[str, ...]  # where the other ranks reach it (ring); empty when not given
    rdma: tuple[Any, ...]  # jaccl: the RDMA device towards each rank (null towards itself)


def parse_hostfile(path: Path) -> tuple[list[Rank], str]:
    """The ranks and the backend named in the file ("" when none); ValueError naming what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"cannot read hostfile {path} ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"hostfile {path} is not JSON ({err})") from None
    backend = ""
    if isinstance(data, dict):
        backend = data.get("backend", "")
        hosts = data.get("hosts")
        if not isinstance(backend, str):
            raise ValueError(f"hostfile {path}: 'backend' must be a string")
    else:
        hosts = data
    if not isinstance(hosts, list) or not hosts:
        raise ValueError(f"hostfile {path}: expected a non-empty list of hosts (or a mapping with 'hosts')")
    ranks = []
    for index, host in enumerate(hosts):
        if not isinstance(host, dict) or not isinstance(host.get("ssh"), str) or not host["ssh"]:
            raise ValueError(f"hostfile {path}: host {index} needs an 'ssh' name")
        ips, rdma = host.get("ips", []), host.get("rdma", [])
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise ValueError(f"hostfile {path}: host {index} 'ips' must be a list of addresses")
        for ip in ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"hostfile {path}: host {index} 'ips' entry {ip!r} is not an IP address") from None
        if not isinstance(rdma, list):
            raise ValueError(f"hostfile {path}: host {index} 'rdma' must be a list")
        ranks.append(Rank(host["ssh"], tuple(ips), tuple(rdma)))
    return ranks, backend


def ranks_from_hosts(hosts: list[str] | tuple[str, ...]) -> list[Rank]:
    """MLX's `--hosts a,b,...`: each name is both the ssh destination and (if an IP) the ring address."""
    import ipaddress

    out = []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
            ips: tuple[str, ...] = (host,)
        except ValueError:
            ips = ()
        out.append(Rank(host, ips, ()))
    return out
