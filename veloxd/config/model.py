"""The typed config: frozen dataclasses holding every default and key description (the schema reads them).

An entry's worker command line is built in veloxd.config.argv (`serve_argv`); what a restart
depends on (`process_key`) and the exact dict round trip of the daemon's state file are in
veloxd.config.roundtrip. The methods here delegate to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any

from veloxd.checks import HOST_PATTERN, SIZE_HELP, SIZE_PATTERN, parse_size
from veloxd.config.argv import serve_argv
from veloxd.kv.config import KVCacheConfig

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
        return serve_argv(self)

    def process_key(self) -> dict[str, Any]:
        """Flat `{key: value}` of everything whose change needs a restart (JSON-serialisable)."""
        from veloxd.config.roundtrip import flat_keys

        return flat_keys(self, live=False)

    def live_key(self) -> dict[str, Any]:
        """Flat `{key: value}` of what can change while the server runs."""
        from veloxd.config.roundtrip import flat_keys

        return flat_keys(self, live=True)

    def to_dict(self) -> dict[str, Any]:
        """The entry as YAML-shaped plain data, defaults included; valid against the schema."""
        from veloxd.config.roundtrip import entry_to_dict

        return entry_to_dict(self)

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> ServerEntry:
        """Build from YAML-shaped data (schema-valid); ValueError when the KV settings are invalid."""
        from veloxd.config.roundtrip import entry_from_dict

        return entry_from_dict(name, data, cls)


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
