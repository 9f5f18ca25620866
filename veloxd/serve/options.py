"""Turn `veloxd serve` flags into validated `ServeOptions`, before anything heavy is imported.

Every mistake here is a `UsageError` naming the culprit (exit 2, well under a second, before
the model loads). No mlx import.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veloxd.kv import registry
from veloxd.kv.config import KVCacheConfig, field_named, fields_for, parse_value

OWN_FLAGS = {"method": "--method", "bits": "--bits", "seed": "--seed"}
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*$")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class UsageError(ValueError):
    """A user mistake in the worker's flags; the message names the flag or field."""


@dataclass(frozen=True)
class ServeOptions:
    model: str
    kv: KVCacheConfig
    host: str = "127.0.0.1"
    port: int = 8080
    adapter_path: str | None = None
    max_tokens: int | None = None
    temp: float | None = None
    top_p: float | None = None
    prompt_cache_size: int | None = None
    prompt_cache_bytes: int | None = None
    api_key_env: str | None = None
    lifeline_fd: int | None = None
    distributed: str | None = None  # "tensor" | "pipeline": one rank of a group started by mlx.launch
    served_names: tuple[str, ...] = ()  # more model names requests may use (the entry's name, for the gateway)
    warnings: tuple[str, ...] = field(default=())

    @property
    def info(self) -> registry.MethodInfo:
        return registry.get(self.kv.method)

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


def parse_overrides(items: list[str], method: str) -> dict[str, Any]:
    """`--set FIELD=VALUE` items → typed values; strict about names and relevance."""
    overrides: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--set {item!r}: expected FIELD=VALUE")
        if name in OWN_FLAGS:
            raise UsageError(f"--set {name}=...: use the {OWN_FLAGS[name]} flag instead")
        try:
            field_named(name)
        except ValueError as err:
            raise UsageError(f"--set {name}: {err}") from None
        if name not in fields_for(method):
            owners = ", ".join(field_named(name).metadata["methods"])
            raise UsageError(f"--set {name}: {name} applies to method {owners}, not {method}")
        if name in overrides:
            raise UsageError(f"--set {name} given twice")
        try:
            overrides[name] = parse_value(name, text.strip())
        except ValueError as err:
            raise UsageError(f"--set {name}: {err}") from None
    return overrides


def parse_size(text: str) -> int:
    """'2G', '512M', '1000000' → bytes (powers of 1024 for suffixes)."""
    match = SIZE.match(text)
    if not match:
        raise UsageError(f"--prompt-cache-bytes {text!r}: expected a size such as 2G, 512M or 1000000")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " KMGT".index(unit.upper() or " "))


def check_model(model: str, flag: str = "--model") -> None:
    looks_local = model.startswith(("/", ".", "~")) or os.path.exists(os.path.expanduser(model))
    if looks_local:
        path = Path(model).expanduser()
        if not path.is_dir():
            raise UsageError(f"{flag} {model}: no such model directory")
        if not (path / "config.json").is_file():
            raise UsageError(f"{flag} {model}: not an MLX model directory (config.json missing)")
    elif not HF_ID.match(model):
        raise UsageError(f"{flag} {model!r}: not a local directory nor a Hugging Face id (owner/name)")


def check_port_free(host: str, port: int) -> None:
    """Fail fast (before loading weights) when another process holds host:port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise UsageError(f"--host {host}: cannot resolve ({err.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise UsageError(f"--port {port}: port {port} on {host} is already in use ({err.strerror})") from None


def build_options(args: Any) -> ServeOptions:
    """Validate parsed argparse flags; raises UsageError."""
    try:
        info = registry.get(args.method)
    except ValueError as err:
        raise UsageError(f"--method: {err}") from None
    overrides = parse_overrides(args.set or [], info.name)
    common: dict[str, Any] = {}
    if args.bits is not None:
        if not info.bits_choices:
            raise UsageError(f"--bits: method {info.name} has no bit width")
        common["bits"] = args.bits
    if args.seed is not None:
        if "seed" not in fields_for(info.name):
            raise UsageError(f"--seed: method {info.name} uses no random seed")
        common["seed"] = args.seed
    try:
        kv = KVCacheConfig(method=info.name, **common, **overrides)
    except ValueError as err:
        raise UsageError(f"--method {info.name}: {err}") from None
    check_model(args.model)
    if args.adapter_path and not Path(args.adapter_path).expanduser().is_dir():
        raise UsageError(f"--adapter-path {args.adapter_path}: no such directory")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be between 1 and 65535")
    for flag, value, low in (("--max-tokens", args.max_tokens, 1), ("--prompt-cache-size", args.prompt_cache_size, 0)):
        if value is not None and value < low:
            raise UsageError(f"{flag} {value}: must be >= {low}")
    if args.temp is not None and args.temp < 0:
        raise UsageError(f"--temp {args.temp}: must be >= 0")
    if args.top_p is not None and not 0 <= args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p}: must be between 0 and 1")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise UsageError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
    cache_bytes = parse_size(args.prompt_cache_bytes) if args.prompt_cache_bytes else None
    distributed = getattr(args, "distributed", None)
    if distributed is None or os.environ.get("MLX_RANK", "0") == "0":  # only rank 0 binds the port
        check_port_free(args.host, args.port)
    return ServeOptions(
        model=args.model,
        kv=kv,
        host=args.host,
        port=args.port,
        adapter_path=args.adapter_path,
        max_tokens=args.max_tokens,
        temp=args.temp,
        top_p=args.top_p,
        prompt_cache_size=args.prompt_cache_size,
        prompt_cache_bytes=cache_bytes,
        api_key_env=args.api_key_env,
        lifeline_fd=args.lifeline_fd,
        distributed=distributed,
        served_names=tuple(getattr(args, "served_name", None) or ()),
        warnings=tuple(_warnings(args, info, cache_bytes)),
    )


def _warnings(args: Any, info: registry.MethodInfo, cache_bytes: int | None) -> list[str]:
    found = []
    if args.host not in LOOPBACK:
        auth = "bearer-token auth via --api-key-env" if args.api_key_env else "NO authentication"
        found.append(f"bound to {args.host}: reachable from the network, {auth}")
    if info.trimmable != "yes":
        found.append(
            f"method {info.name} cannot trim its cache once it has evicted tokens: "
            "prefix reuse happens only on exact repeats"
        )
    if not info.batchable:
        found.append(f"method {info.name} does not batch: requests are served one at a time")
        if cache_bytes is not None:
            found.append(
                "--prompt-cache-bytes will not apply: mlx_lm 0.32 enforces the byte bound only on its "
                "batched path, and this method is served unbatched (--prompt-cache-size still applies)"
            )
    return found
