"""Turn `veloxd serve` flags into validated `ServeOptions`, before anything heavy is imported.

Every mistake here is a `UsageError` naming the culprit (exit 2, well under a second, before
the model loads). No mlx import.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veloxd import protocol
from veloxd.checks import SIZE_HELP, host_problem, is_loopback, parse_size, resolve_model
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, KVCacheConfig, KVConfigError, field_named, fields_for, parse_value
from veloxd.serve.limits import RequestLimits


class UsageError(ValueError):
    """A user mistake in the worker's flags; the message names the flag or field."""


class PortInUse(UsageError):
    """--port is held by another process: not the flag's fault, and it may clear (exit PORT_IN_USE)."""


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
    limits: RequestLimits = field(default_factory=RequestLimits)
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
        if name == "method" or name in OWN_KEYS:
            raise UsageError(f"--set {name}=...: use the --{name} flag instead")
        try:
            field_named(name)
        except KVConfigError as err:
            raise UsageError(f"--set {name}: {err}") from None
        if name not in fields_for(method):
            owners = ", ".join(field_named(name).metadata["methods"])
            raise UsageError(f"--set {name}: {name} applies to method {owners}, not {method}")
        if name in overrides:
            raise UsageError(f"--set {name} given twice")
        try:
            overrides[name] = parse_value(name, text.strip())
        except KVConfigError as err:
            raise UsageError(f"--set {name}: {err}") from None
    return overrides


def size_flag(flag: str, text: str | None) -> int | None:
    """A size flag under veloxd's one unit rule (veloxd.checks: 2G = 2,000,000,000; 2Gi = 2**31)."""
    if text is None:
        return None
    try:
        return parse_size(int(text) if text.strip().isdigit() else text)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected {SIZE_HELP}") from None


def check_model(model: str, flag: str = "--model") -> None:
    """A local model directory (relative to the cwd) or a Hugging Face id, by the config loader's rule."""
    problem = resolve_model(model, Path.cwd()).problem
    if problem:
        raise UsageError(f"{flag}: {problem}")


def kv_config(args: Any) -> KVCacheConfig:
    """The KV settings: one JSON document (--kv-json, what the daemon passes) or the hand-written flags."""
    if args.kv_json is not None:
        hand_flags = [
            f
            for f, v in (("--method", args.method), ("--bits", args.bits), ("--seed", args.seed), ("--set", args.set))
            if v
        ]
        if hand_flags:
            raise UsageError(f"--kv-json holds every KV setting: drop {', '.join(hand_flags)}")
        try:
            document = protocol.read_kv_document(args.kv_json)
            return KVCacheConfig.from_dict(document)
        except protocol.ProtocolError as err:
            raise UsageError(str(err)) from None
        except KVConfigError as err:
            raise UsageError(f"--kv-json: {err.field}: {err.message}") from None
    try:
        info = registry.get(args.method or "affine")
    except ValueError as err:
        raise UsageError(f"--method: {err}") from None
    overrides = parse_overrides(args.set or [], info.name)
    common: dict[str, Any] = {}
    if args.bits is not None:
        if not info.bits_choices:
            raise UsageError(f"--bits: {registry.bits_refusal(info.name, args.bits)}")
        common["bits"] = args.bits
    if args.seed is not None:
        if "seed" not in fields_for(info.name):
            raise UsageError(f"--seed: method {info.name} uses no random seed")
        common["seed"] = args.seed
    try:
        return KVCacheConfig(method=info.name, **common, **overrides)
    except KVConfigError as err:
        raise UsageError(f"--method {info.name}: {err}") from None


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
            raise PortInUse(f"--port {port}: port {port} on {host} is already in use ({err.strerror})") from None


def build_options(args: Any) -> ServeOptions:
    """Validate parsed argparse flags; raises UsageError."""
    kv = kv_config(args)
    info = registry.get(kv.method)
    check_model(args.model)
    if args.adapter_path and not Path(args.adapter_path).expanduser().is_dir():
        raise UsageError(f"--adapter-path {args.adapter_path}: no such directory")
    problem = host_problem(args.host)
    if problem:
        raise UsageError(f"--host {problem}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be between 1 and 65535")
    for flag, value, low in (
        ("--max-tokens", args.max_tokens, 1),
        ("--prompt-cache-size", args.prompt_cache_size, 0),
        ("--limit-max-tokens", args.limit_max_tokens, 1),
        ("--limit-max-prompt-tokens", args.limit_max_prompt_tokens, 1),
    ):
        if value is not None and value < low:
            raise UsageError(f"{flag} {value}: must be >= {low}")
    if args.temp is not None and args.temp < 0:
        raise UsageError(f"--temp {args.temp}: must be >= 0")
    if args.top_p is not None and not 0 <= args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p}: must be between 0 and 1")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise UsageError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
    if args.request_body_timeout <= 0:
        raise UsageError(f"--request-body-timeout {args.request_body_timeout}: must be > 0 seconds")
    cache_bytes = size_flag("--prompt-cache-bytes", args.prompt_cache_bytes)
    limits = RequestLimits(
        max_tokens=args.limit_max_tokens,
        max_prompt_tokens=args.limit_max_prompt_tokens,
        body_timeout_s=args.request_body_timeout,
        max_body_bytes=size_flag("--max-body-bytes", args.max_body_bytes) or RequestLimits.max_body_bytes,
    )
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
        limits=limits,
        lifeline_fd=args.lifeline_fd,
        distributed=distributed,
        served_names=tuple(getattr(args, "served_name", None) or ()),
        warnings=tuple(_warnings(args, info, cache_bytes)),
    )


def _warnings(args: Any, info: registry.MethodInfo, cache_bytes: int | None) -> list[str]:
    found = []
    if not is_loopback(args.host):
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
