"""The typed config: frozen dataclasses holding every default and key description (the schema reads them).

Also the worker command line of an entry (`serve_argv`), what a restart depends on
(`process_key`), and the exact dict round trip used by the daemon's state file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any

from veloxd import protocol
from veloxd.checks import HOST_PATTERN, SIZE_HELP, SIZE_PATTERN, parse_size
from veloxd.kv.config import OWN_KEYS, KVCacheConfig, fields_for

if TYPE_CHECKING:
    from veloxd.config.gateway import Gateway

VERSION = 1
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Schemas of keys that mean the same wherever they stand (servers, dashboard, gateway), defined
# once so that the blocks accept the same values.
HOST_SCHEMA = {"type": "string", "pattern": HOST_PATTERN, "maxLength": 253}
PORT_SCHEMA = {"type": "integer", "minimum": 1, "maximum": 65535}
API_KEY_ENV_SCHEMA = {"type": ["string", "null"], "pattern": ENV_NAME_PATTERN}
ENV_SCHEMA = {
    "type": "object",
    "propertyNames": {"pattern": ENV_NAME_PATTERN},
    "additionalProperties": {"type": "string"},
}
SIZE_SCHEMA = {"type": ["integer", "string"], "minimum": 1, "pattern": SIZE_PATTERN}
SIZE_OR_NULL_SCHEMA = {"type": ["integer", "string", "null"], "minimum": 1, "pattern": SIZE_PATTERN}


def size_or_none(value: int | str | None) -> int | None:
    """The `convert` of a size key that may be unset."""
    return None if value is None else parse_size(value)


def key(
    default: Any = MISSING,
    *,
    help: str,
    schema: dict[str, Any],
    live: bool = False,
    factory: Callable[[], Any] | Any = MISSING,
    convert: Callable[[Any], Any] | None = None,
) -> Any:
    """A YAML key: default, description, JSON Schema constraints; `live` keys change without a restart."""
    meta = {"help": help, "schema": schema, "live": live, "convert": convert}
    return field(default=default, default_factory=factory, metadata=meta)


def section(cls: type, *, help: str, live: bool = False, optional: bool = False) -> Any:
    """A nested mapping of keys, itself a dataclass declared with `key`; `optional`: absent (None) by default."""
    meta = {"help": help, "section": cls, "live": live, "optional": optional}
    return field(default=None, metadata=meta) if optional else field(default_factory=cls, metadata=meta)


@dataclass(frozen=True)
class Sampling:
    temp: float = key(
        0.0,
        help="Sampling temperature for requests that set none; 0 is greedy.",
        schema={"type": "number", "minimum": 0, "maximum": 2},
    )
    top_p: float = key(
        1.0,
        help="Nucleus-sampling top-p for requests that set none; 1 keeps every token.",
        schema={"type": "number", "minimum": 0, "maximum": 1},
    )
    max_tokens: int = key(
        512,
        help="Maximum tokens generated for requests that set no limit.",
        schema={"type": "integer", "minimum": 1, "maximum": 1 << 20},
    )


@dataclass(frozen=True)
class PromptCache:
    size: int = key(
        10,
        help="Distinct prompt KV caches kept for reuse across requests.",
        schema={"type": "integer", "minimum": 1, "maximum": 100000},
    )
    bytes: int | None = key(
        None,
        help=f"Cap on the memory of the kept caches: {SIZE_HELP}; unset: no cap.",
        schema=SIZE_OR_NULL_SCHEMA,
        convert=size_or_none,
    )


@dataclass(frozen=True)
class Limits:
    max_tokens: int | None = key(
        None,
        help="Most tokens one request may generate; a request asking for more "
        'gets this many (finish_reason "length"). null: the model\'s context length.',
        schema={"type": ["integer", "null"], "minimum": 1, "maximum": 1 << 24},
    )
    max_prompt_tokens: int | None = key(
        None,
        help="Longest prompt accepted, in tokens; a longer one gets HTTP 400 "
        "naming both numbers, before any prefill. null: the model's context length.",
        schema={"type": ["integer", "null"], "minimum": 1, "maximum": 1 << 24},
    )
    request_body_timeout_s: float = key(
        30.0,
        help="Seconds a client has to send a request's body (and each "
        "read of its headers); a slower one gets 408 and the connection closes.",
        schema={"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
    )
    max_body_bytes: int = key(
        32 * 2**20,
        help=f"Largest request body accepted ({SIZE_HELP}); a larger Content-Length gets 413 before anything is read.",
        schema=SIZE_SCHEMA,
        convert=parse_size,
    )


@dataclass(frozen=True)
class RestartPolicy:
    max_failures: int = key(
        5,
        help="Failed starts or crashes within window_s after which the server is FATAL "
        "(left stopped until its entry changes or `veloxd restart NAME`).",
        schema={"type": "integer", "minimum": 1, "maximum": 1000},
    )
    window_s: float = key(
        300.0,
        help="Seconds over which failures are counted.",
        schema={"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
    )
    backoff_initial_s: float = key(
        1.0,
        help="Delay before the first restart; it doubles after each failure.",
        schema={"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
    )
    backoff_max_s: float = key(
        60.0,
        help="Longest delay between restarts; at least backoff_initial_s.",
        schema={"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
    )


@dataclass(frozen=True)
class Distributed:
    """One server over several ranks (machines) through MLX's launcher; veloxd/distributed/ runs it."""

    hosts: tuple[str, ...] | None = key(
        None,
        help="The ranks, one IP address per rank, rank 0 first (MLX's "
        "`--hosts`); rank 0 must be this machine and serves HTTP. 127.0.0.1 "
        "starts a rank locally, any other address over ssh. Give hosts or hostfile.",
        schema={
            "type": ["array", "null"],
            "minItems": 2,
            "maxItems": 64,
            "items": HOST_SCHEMA,
        },
        convert=lambda value: None if value is None else tuple(value),
    )
    hostfile: str | None = key(
        None,
        help="An MLX hostfile (JSON, as `mlx.distributed_config` writes it; "
        "relative paths resolve against this file's directory) instead of hosts.",
        schema={"type": ["string", "null"], "minLength": 1},
    )
    backend: str = key(
        "ring",
        help="MLX's distributed backend: ring (TCP over Ethernet or Thunderbolt) or jaccl "
        "(RDMA over Thunderbolt 5; needs a hostfile with RDMA devices).",
        schema={"type": "string", "enum": ["ring", "jaccl"]},
    )
    parallelism: str = key(
        "tensor",
        help="tensor: every rank holds a share of every layer's heads; pipeline: "
        "every rank holds a run of layers (method fp16, models with pipeline support and a "
        "sharded checkpoint index only).",
        schema={"type": "string", "enum": ["tensor", "pipeline"]},
    )
    port: int = key(
        32323,
        help="First TCP port of the ranks' own connections (ring: rank r listens on port + r; "
        "jaccl: the coordinator's port); distinct per distributed server.",
        schema={"type": "integer", "minimum": 1024, "maximum": 65000},
    )
    python: str | None = key(
        None,
        help="Python interpreter with veloxd installed on every host (an absolute "
        "path); unset: the daemon's own interpreter, at the same path on every host.",
        schema={"type": ["string", "null"], "minLength": 1},
    )
    cwd: str | None = key(
        None,
        help="Working directory of the ranks on every host; unset: the daemon's, when it exists there.",
        schema={"type": ["string", "null"], "minLength": 1},
    )
    env: Mapping[str, str] = key(
        factory=dict,
        help="Environment variables exported on every rank, remote "
        "ones included (the entry's env reaches only local ranks).",
        schema=ENV_SCHEMA,
    )

    @property
    def local_ranks_only(self) -> bool:
        return self.hosts is not None and all(h == "127.0.0.1" for h in self.hosts)


@dataclass(frozen=True, kw_only=True)
class ServerEntry:
    """One server of veloxd.yaml, defaults applied, paths resolved, KV cache validated."""

    name: str
    model: str = key(
        help="Model to serve: a local MLX model directory (relative paths resolve against this "
        "file's directory, ~ expands) or a Hugging Face id 'owner/name'.",
        schema={"type": "string", "minLength": 1},
    )
    port: int = key(
        None,
        help="TCP port of this server's OpenAI-compatible API; host:port pairs must be unique. "
        "May be left out when a `gateway:` block is present: then assigned from 38100-38999 (a hash of "
        "the name, the same on every reload).",
        schema={"type": ["integer", "null"], "minimum": 1, "maximum": 65535},
    )
    host: str = key(
        "127.0.0.1",
        help="Address to bind. Loopback by default; any other address exposes the "
        "server and needs api_key_env, or allow_unauthenticated: true.",
        schema=HOST_SCHEMA,
    )
    kv: KVCacheConfig = field(metadata={"kv": True})  # YAML keys: method, bits, seed, overrides
    sampling: Sampling = section(Sampling, help="Sampling defaults for requests that do not set their own.")
    prompt_cache: PromptCache = section(
        PromptCache, help="mlx_lm's prompt cache: reuses the KV cache of a shared prefix across requests."
    )
    limits: Limits = section(
        Limits,
        help="Bounds on the work one request may cause: tokens generated, prompt length, request body size and time.",
    )
    env: Mapping[str, str] = key(
        factory=dict,
        help="Extra environment variables for this server's process (string values: quote numbers).",
        schema=ENV_SCHEMA,
    )
    adapter_path: str | None = key(
        None,
        help="LoRA adapter directory loaded on top of the model (relative "
        "paths resolve against this file's directory).",
        schema={"type": ["string", "null"], "minLength": 1},
    )
    api_key_env: str | None = key(
        None,
        help="Name of an environment variable (the daemon's, or from env) "
        "holding the bearer token clients must send; unset: no authentication.",
        schema=API_KEY_ENV_SCHEMA,
    )
    allow_unauthenticated: bool = key(
        False,
        help="Set true to bind a non-loopback host without api_key_env, deliberately.",
        schema={"type": "boolean"},
        live=True,
    )
    description: str = key(
        "",
        help="Free text shown by `veloxd status`; changing it restarts nothing.",
        schema={"type": "string", "maxLength": 1000},
        live=True,
    )
    ready_timeout_s: float = key(
        600.0,
        help="Seconds allowed for loading the model until the worker reports "
        "ready; longer counts as a failed start. A download before it does not count.",
        schema={"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
        live=True,
    )
    stop_timeout_s: float = key(
        30.0,
        help="Seconds between SIGTERM and SIGKILL when stopping the server.",
        schema={"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        live=True,
    )
    aliases: tuple[str, ...] = key(
        (),
        help="More model names the gateway routes to this server (besides its "
        "name and its Hugging Face id). Applies without a restart.",
        schema={"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 200}, "uniqueItems": True},
        live=True,
        convert=tuple,
    )
    start: str = key(
        "always",
        help="always: run while the daemon runs; on_demand: started by the gateway on "
        "the first request for it, stopped again after idle_unload_s (needs a `gateway:` block).",
        schema={"type": "string", "enum": ["always", "on_demand"]},
        live=True,
    )
    idle_unload_s: float | None = key(
        None,
        help="Seconds without requests after which the gateway stops an "
        "on_demand server; unset: it stays until memory is needed.",
        schema={"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 31536000},
        live=True,
    )
    concurrency: int = key(
        4,
        help="Requests the gateway forwards to this server at once (more wait in a "
        "queue); memory admission counts this many full-context KV caches.",
        schema={"type": "integer", "minimum": 1, "maximum": 1024},
        live=True,
    )
    restart: RestartPolicy = section(
        RestartPolicy,
        help="What happens when the server crashes or fails to start: exponential backoff, then FATAL.",
        live=True,
    )
    distributed: Distributed | None = section(
        Distributed,
        optional=True,
        help="Serve this model sharded over "
        "several ranks (Macs) with MLX's launcher, supervised as one unit "
        "(docs/distributed.md); unset: one process on this machine.",
    )

    @property
    def method(self) -> str:
        return self.kv.method

    def serve_argv(self) -> list[str]:
        """The flags of `veloxd serve` that run this entry (without the program name)."""
        s, pc, lim = self.sampling, self.prompt_cache, self.limits
        argv = ["--model", self.model, protocol.KV_JSON_FLAG, protocol.kv_document(self.kv.to_dict())]
        argv += ["--host", self.host, "--port", str(self.port)]
        if self.adapter_path:
            argv += ["--adapter-path", self.adapter_path]
        argv += ["--max-tokens", str(s.max_tokens), "--temp", str(s.temp), "--top-p", str(s.top_p)]
        argv += ["--prompt-cache-size", str(pc.size)]
        if pc.bytes is not None:
            argv += ["--prompt-cache-bytes", str(pc.bytes)]
        if lim.max_tokens is not None:
            argv += ["--limit-max-tokens", str(lim.max_tokens)]
        if lim.max_prompt_tokens is not None:
            argv += ["--limit-max-prompt-tokens", str(lim.max_prompt_tokens)]
        argv += ["--request-body-timeout", str(lim.request_body_timeout_s), "--max-body-bytes", str(lim.max_body_bytes)]
        if self.api_key_env:
            argv += ["--api-key-env", self.api_key_env]
        argv += ["--served-name", self.name]  # the gateway forwards requests under the entry's name
        return argv

    def process_key(self) -> dict[str, Any]:
        """Flat `{key: value}` of everything whose change needs a restart (JSON-serialisable)."""
        return _flat_keys(self, live=False)

    def live_key(self) -> dict[str, Any]:
        """Flat `{key: value}` of what can change while the server runs."""
        return _flat_keys(self, live=True)

    def to_dict(self) -> dict[str, Any]:
        """The entry as YAML-shaped plain data, defaults included; valid against the schema."""
        out: dict[str, Any] = {}
        for f in yaml_fields(ServerEntry):
            value = getattr(self, f.name)
            if "kv" in f.metadata:
                out.update(_kv_to_dict(value))
            elif "section" in f.metadata:
                out[f.name] = None if value is None else _section_to_dict(value)
            else:
                out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> ServerEntry:
        """Build from YAML-shaped data (schema-valid); ValueError when the KV settings are invalid."""
        kwargs: dict[str, Any] = {"name": name}
        for f in yaml_fields(cls):
            if "kv" in f.metadata:
                kwargs["kv"] = _kv_from_dict(data)
            elif f.name in data and "section" in f.metadata:
                given = data[f.name]
                if given is None and f.metadata.get("optional"):
                    continue
                kwargs[f.name] = _section_from_dict(f.metadata["section"], given or {})
            elif f.name in data:
                kwargs[f.name] = _coerce(f, data[f.name])
        return cls(**kwargs)


@dataclass(frozen=True)
class Dashboard:
    """The `dashboard:` block: a local web page and /metrics, served by the `veloxd web` process."""

    host: str = key(
        "127.0.0.1",
        help="Loopback address the dashboard and /metrics bind (it shows logs and "
        "states without authentication, so only 127.0.0.1, ::1 or localhost).",
        schema=HOST_SCHEMA,
    )
    port: int = key(
        8090,
        help="TCP port of the dashboard, its JSON API and /metrics.",
        schema=PORT_SCHEMA,
    )
    api_key_env: str | None = key(
        None,
        help="Name of an environment variable of the daemon holding the bearer "
        "token that enables actions (restart, reload) from the page and API; unset: "
        "read-only.",
        schema=API_KEY_ENV_SCHEMA,
    )
    interval_s: float = key(
        1.0,
        help="Seconds between samples of states, memory and request counters (live updates and charts).",
        schema={"type": "number", "minimum": 0.2, "maximum": 60},
    )
    history: int = key(
        900,
        help="Samples kept for the memory and tokens-per-second charts.",
        schema={"type": "integer", "minimum": 10, "maximum": 100000},
    )


@dataclass(frozen=True)
class Config:
    """A whole veloxd.yaml: `servers` in file order; `sha256` of the file's bytes."""

    version: int
    servers: Mapping[str, ServerEntry]
    source: str
    sha256: str
    dashboard: Dashboard | None = field(
        default=None,
        metadata={
            "section": Dashboard,
            "help": "A local dashboard and Prometheus /metrics (`veloxd web`, supervised by the daemon); absent: "
            "none. With a gateway: block the gateway serves both on its own port and this block is refused.",
        },
    )
    gateway: Gateway | None = None

    def supervised(self) -> dict[str, Any]:
        """Every process the daemon runs, by name: the servers, then the gateway if there is one."""
        from veloxd.config.gateway import GATEWAY_NAME, GatewayEntry

        extra = {GATEWAY_NAME: GatewayEntry(self.gateway)} if self.gateway is not None else {}
        return {**self.servers, **extra}


def yaml_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The dataclass fields that are YAML keys (or, for `kv`, stand for method/bits/seed/overrides)."""
    return tuple(f for f in dataclasses.fields(cls) if f.metadata)


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain data for the state file; `config_from_dict` inverts it exactly."""
    out = {
        "version": config.version,
        "source": config.source,
        "sha256": config.sha256,
        "servers": {name: entry.to_dict() for name, entry in config.servers.items()},
        **({"gateway": config.gateway.to_dict()} if config.gateway is not None else {}),
    }
    if config.dashboard is not None:  # absent means none: an explicit null would not validate
        out["dashboard"] = dataclasses.asdict(config.dashboard)
    return out


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Inverse of `config_to_dict` (no file-system checks); ValueError when `data` is malformed."""
    from veloxd.config.gateway import Gateway

    try:
        servers = {name: ServerEntry.from_dict(name, entry) for name, entry in data["servers"].items()}
        gateway = Gateway.from_dict(data["gateway"]) if data.get("gateway") is not None else None
        return Config(
            version=int(data["version"]),
            servers=servers,
            source=str(data["source"]),
            sha256=str(data["sha256"]),
            dashboard=dashboard_from_dict(data.get("dashboard")),
            gateway=gateway,
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"malformed config data: {type(err).__name__}: {err}") from None


def dashboard_from_dict(data: Mapping[str, Any] | None) -> Dashboard | None:
    """The `dashboard:` block from schema-valid data; None when absent."""
    return None if data is None else _section_from_dict(Dashboard, data)


def _kv_to_dict(kv: KVCacheConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"method": kv.method}
    out.update({own: getattr(kv, own) for own in OWN_KEYS if own in fields_for(kv.method)})
    out["overrides"] = kv.overrides()
    return out


def _kv_from_dict(data: Mapping[str, Any]) -> KVCacheConfig:
    values: dict[str, Any] = {"method": data["method"]}
    values.update(data.get("overrides") or {})
    for own in OWN_KEYS:
        if data.get(own) is not None:
            values[own] = data[own]
    for name, value in values.items():
        if isinstance(value, float) and value.is_integer():
            values[name] = int(value)  # JSON Schema's "integer" admits 32.0
    return KVCacheConfig.from_dict(values)


def _section_from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """A section from schema-valid data: the keys given, coerced; the others keep their defaults."""
    return cls(**{f.name: _coerce(f, data[f.name]) for f in yaml_fields(cls) if f.name in data})


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Normalise a schema-valid value to the field's Python type (32.0 -> 32 for integers, 1 -> 1.0 for numbers)."""
    if f.metadata.get("convert"):
        return f.metadata["convert"](value)
    kind = f.metadata["schema"].get("type")
    if value is None or isinstance(value, bool):
        return value
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "number" and isinstance(value, int):
        return float(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _flat_keys(entry: ServerEntry, *, live: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in yaml_fields(ServerEntry):
        if f.metadata.get("live", False) != live:
            continue
        value = getattr(entry, f.name)
        if "kv" in f.metadata:
            for name, setting in value.to_dict().items():
                out[name if name == "method" or name in OWN_KEYS else f"overrides.{name}"] = setting
        elif "section" in f.metadata:
            if value is None:
                out[f.name] = None
            else:
                out.update({f"{f.name}.{k}": v for k, v in _section_to_dict(value).items()})
        elif isinstance(value, Mapping):
            out.update({f"{f.name}.{k}": value[k] for k in sorted(value)})
        else:
            out[f.name] = value
    return out


def _section_to_dict(value: Any) -> dict[str, Any]:
    """A section as YAML-shaped data, key by key."""
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}


def _plain(value: Any) -> Any:
    """A key's value as YAML-shaped data: tuples as lists, mappings as dicts."""
    return list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)
