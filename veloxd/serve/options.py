"""Turn `veloxd serve`'s settings (the --entry-json document, or the hand-typed flags) into validated
`ServeOptions`, before anything heavy is imported.

Every mistake here is a `UsageError` naming the culprit (exit 2, well under a second, before
the model loads). No mlx import.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from veloxd import entry_bounds, protocol
from veloxd.checks import SIZE_HELP, host_problem, is_loopback, parse_size, resolve_model
from veloxd.endpoints import cannot_listen_on, port_in_use
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, KVCacheConfig, KVConfigError, field_named, fields_for, parse_value
from veloxd.kv.refusals import not_applicable
from veloxd.serve.limits import RequestLimits


class UsageError(ValueError):
    """A user mistake in the worker's flags; the message names the flag or field."""


class CannotListen(UsageError):
    """--host/--port cannot be listened on now (the port held by another process, the address not
    this machine's yet): not the flag's fault, and it may clear (exit PORT_IN_USE)."""


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


PARALLELISMS = tuple(entry_bounds.PARALLELISM["enum"])  # --distributed: how a group shares the model
# Each bounded setting's schema: the config's own (veloxd.entry_bounds), so a value `veloxd check`
# refuses in veloxd.yaml is refused here too.
BOUNDS: dict[str, dict[str, Any]] = {
    "port": entry_bounds.PORT,
    "max_tokens": entry_bounds.MAX_TOKENS,
    "temp": entry_bounds.TEMP,
    "top_p": entry_bounds.TOP_P,
    "prompt_cache_size": entry_bounds.PROMPT_CACHE_SIZE,
    "limit_max_tokens": entry_bounds.REQUEST_TOKENS,
    "limit_max_prompt_tokens": entry_bounds.REQUEST_TOKENS,
    "request_body_timeout": entry_bounds.REQUEST_BODY_TIMEOUT,
    "distributed": entry_bounds.PARALLELISM,
}
# The document keys (flag dests) that are ServeOptions fields of the same name and meaning; the
# others are converted (kv, sizes) or grouped (limits) by build_options.
SAME_NAMED = tuple(
    f.name for f in fields(ServeOptions) if f.name in protocol.ENTRY_KEYS and f.name not in ("kv", "prompt_cache_bytes")
)


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
            raise UsageError(f"--set {name}: {not_applicable(name, method, field_named(name).metadata['methods'])}")
        if name in overrides:
            raise UsageError(f"--set {name} given twice")
        try:
            overrides[name] = parse_value(name, text.strip())
        except KVConfigError as err:
            raise UsageError(f"--set {name}: {err}") from None
    return overrides


def size_flag(flag: str, value: str | int | None) -> int | None:
    """A size under veloxd's one unit rule (veloxd.checks: 2G = 2,000,000,000; 2Gi = 2**31)."""
    if value is None:
        return None
    try:
        return parse_size(int(value) if isinstance(value, str) and value.strip().isdigit() else value)
    except ValueError:
        raise UsageError(f"{flag} {value!r}: expected {SIZE_HELP}") from None


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
            raise UsageError(f"--seed: {not_applicable('seed', info.name, field_named('seed').metadata['methods'])}")
        common["seed"] = args.seed
    try:
        return KVCacheConfig(method=info.name, **common, **overrides)
    except KVConfigError as err:  # named by the flag that holds the value: the one to change
        raise UsageError(f"{kv_flag(err.field)}: {err.message}") from None


def kv_flag(field: str) -> str:
    """The hand-typed flag that sets a KVCacheConfig field: --method, --bits, --seed, else --set FIELD."""
    return f"--{field}" if field == "method" or field in OWN_KEYS else f"--set {field}"


def check_port_free(host: str, port: int) -> None:
    """Fail fast (before loading weights) when this machine cannot listen on host:port now: the
    host does not resolve or is not this machine's, or another process holds the port."""
    if problem := cannot_listen_on(host):
        raise CannotListen(f"--host {host}: {problem}")
    if port_in_use(host, port):
        raise CannotListen(f"--port {port}: port {port} on {host} is already in use")


def flag_name(key: str) -> str:
    """The `veloxd serve` flag of a document key (veloxd.protocol.ENTRY_KEYS are the flags' dests)."""
    return protocol.KV_JSON_FLAG if key == "kv" else "--" + key.replace("_", "-")


def document_name(key: str) -> str:
    return f"{protocol.ENTRY_JSON_FLAG} {key}"


def given_flags(args: Any) -> list[str]:
    """The setting flags given on the command line (every setting flag defaults to None)."""
    hand_kv = {"method": args.method, "bits": args.bits, "seed": args.seed, "set": args.set, "kv": args.kv_json}
    values = {key: getattr(args, key) for key in protocol.ENTRY_KEYS if key != "kv"} | hand_kv
    return [flag_name(key) for key, value in values.items() if value not in (None, [])]


def settings_and_kv(args: Any) -> tuple[dict[str, Any], KVCacheConfig, Callable[[str], str]]:
    """The worker's settings by document key (None: the default), its KV config, and how an error
    names a key: from the --entry-json document, or from the hand-typed flags."""
    if args.entry_json is None:
        if args.model is None:
            raise UsageError(f"--model is required (or every setting as one document, {protocol.ENTRY_JSON_FLAG})")
        return {key: getattr(args, key) for key in protocol.ENTRY_KEYS if key != "kv"}, kv_config(args), flag_name
    others = given_flags(args)
    if others:
        raise UsageError(f"{protocol.ENTRY_JSON_FLAG} holds every setting: drop {', '.join(others)}")
    try:
        settings = protocol.read_entry_document(args.entry_json)
        kv = KVCacheConfig.from_dict(settings["kv"])
    except protocol.ProtocolError as err:
        raise UsageError(str(err)) from None
    except KVConfigError as err:
        raise UsageError(f"{document_name('kv')}: {err.field}: {err.message}") from None
    return settings, kv, document_name


def check_settings(settings: dict[str, Any], name: Callable[[str], str]) -> None:
    """Each setting within its bounds (None: not given, the default applies); UsageError naming it."""
    check_model(settings["model"], name("model"))
    if settings["adapter_path"] and not Path(settings["adapter_path"]).expanduser().is_dir():
        raise UsageError(f"{name('adapter_path')} {settings['adapter_path']}: no such directory")
    if settings["host"] is not None and (problem := host_problem(settings["host"])):
        raise UsageError(f"{name('host')} {problem}")
    for key, schema in BOUNDS.items():
        value = settings[key]
        if value is not None and (problem := entry_bounds.out_of_bounds(value, schema)):
            raise UsageError(f"{name(key)} {value!r}: {problem}")
    api_key_env = settings["api_key_env"]
    if api_key_env and not os.environ.get(api_key_env):
        raise UsageError(f"{name('api_key_env')} {api_key_env}: that environment variable is not set or empty")
    if settings["distributed"] is not None and settings["adapter_path"]:  # as the config refuses it
        raise UsageError(
            f"{name('adapter_path')}: mlx_lm loads no LoRA adapter on a sharded model ({name('distributed')})"
        )


def build_options(args: Any) -> ServeOptions:
    """Validate the parsed flags of `veloxd serve`, the --entry-json document or the hand-typed
    flags (one set of checks for both); raises UsageError naming the flag or the document key."""
    settings, kv, name = settings_and_kv(args)
    check_settings(settings, name)
    limits = {
        "max_tokens": settings["limit_max_tokens"],
        "max_prompt_tokens": settings["limit_max_prompt_tokens"],
        "body_timeout_s": settings["request_body_timeout"],
        "max_body_bytes": size_flag(name("max_body_bytes"), settings["max_body_bytes"]),
    }
    same_named = {key: settings[key] for key in SAME_NAMED}  # model, host, port, sampling, ...
    options = ServeOptions(
        **{key: value for key, value in same_named.items() if value is not None},  # None: the field's default
        kv=kv,
        prompt_cache_bytes=size_flag(name("prompt_cache_bytes"), settings["prompt_cache_bytes"]),
        limits=RequestLimits(**{key: value for key, value in limits.items() if value is not None}),
        lifeline_fd=args.lifeline_fd,
        served_names=tuple(settings["served_name"] or ()),
    )
    if options.distributed is None or os.environ.get("MLX_RANK", "0") == "0":  # only rank 0 binds the port
        check_port_free(options.host, options.port)
    return replace(options, warnings=tuple(_warnings(options)))


def _warnings(options: ServeOptions) -> list[str]:
    found = []
    info = options.info
    if not is_loopback(options.host):
        auth = "bearer-token auth via --api-key-env" if options.api_key_env else "NO authentication"
        found.append(f"bound to {options.host}: reachable from the network, {auth}")
    if info.trimmable != "yes":
        found.append(
            f"method {info.name} cannot trim its cache once it has evicted tokens: "
            "prefix reuse happens only on exact repeats"
        )
    if not info.batchable:
        found.append(f"method {info.name} does not batch: requests are served one at a time")
        if options.prompt_cache_bytes is not None:
            found.append(
                "--prompt-cache-bytes will not apply: mlx_lm 0.32 enforces the byte bound only on its "
                "batched path, and this method is served unbatched (--prompt-cache-size still applies)"
            )
    return found
