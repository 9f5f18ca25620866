"""The typed config: frozen dataclasses holding every default and key description (the schema reads them).

A server entry's nested blocks are in veloxd.config.sections, the key declarations they all use in
veloxd.config.keys. An entry builds its worker's command line itself (`serve_argv`: one document); what a
restart depends on (`process_key`) and the entry's plain-data form come from veloxd.config.codec,
the whole file's round trip (the daemon's state file) from veloxd.config.roundtrip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from veloxd import entry_bounds, protocol
from veloxd.config.codec import entry_from_dict, entry_to_dict, flat_keys, worker_settings
from veloxd.config.gateway import ASSIGNED_PORTS
from veloxd.config.keys import API_KEY_ENV_SCHEMA, ENV_SCHEMA, HOST_SCHEMA, PATH_OR_NULL_SCHEMA, key, seconds, section
from veloxd.config.sections import Dashboard, Distributed, Health, Limits, PromptCache, RestartPolicy, Sampling
from veloxd.kv.config import KVCacheConfig

if TYPE_CHECKING:
    from veloxd.config.gateway import Gateway, GatewayEntry

VERSION = 1
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"


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
        "May be left out (or null) when a `gateway:` block is present: then assigned from "
        f"{ASSIGNED_PORTS[0]}-{ASSIGNED_PORTS[1]} (a hash of the name, skipping ports other entries "
        "give: the same on every reload while those stay).",
        schema={**entry_bounds.PORT, "type": ["integer", "null"]},
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
        schema=PATH_OR_NULL_SCHEMA,
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
        help="Free text shown under the name on the dashboard and in `veloxd status --json`; changing it restarts nothing.",
        schema={"type": "string", "maxLength": 1000},
        live=True,
    )
    ready_timeout_s: float = key(
        600.0,
        help="Seconds allowed for loading the model until the worker reports "
        "ready; longer counts as a failed start. A download before it does not count.",
        schema=seconds(86400),
        live=True,
    )
    stop_timeout_s: float = key(
        30.0,
        help="Seconds between SIGTERM and SIGKILL when stopping the server.",
        schema=seconds(3600),
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
        schema=seconds(31536000, nullable=True),
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
    health: Health = section(
        Health,
        help="Liveness: how often a ready server's /health is probed, how long a probe may take, and "
        "how many failures in a row mark it unresponsive (killed and restarted like a crash).",
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

    @property
    def program(self) -> None:
        """None: run by the daemon's worker command (`veloxd serve`; veloxd.daemon.supervised)."""
        return None

    def serve_argv(self) -> list[str]:
        """The settings of `veloxd serve` that run this entry: one JSON document (veloxd.protocol)."""
        return [protocol.ENTRY_JSON_FLAG, protocol.entry_document(worker_settings(self))]

    def process_key(self) -> dict[str, Any]:
        """Flat `{key: value}` of everything whose change needs a restart (JSON-serialisable)."""
        return flat_keys(self, live=False)

    def live_key(self) -> dict[str, Any]:
        """Flat `{key: value}` of what can change while the server runs."""
        return flat_keys(self, live=True)

    def to_dict(self) -> dict[str, Any]:
        """The entry as YAML-shaped plain data, defaults included; valid against the schema."""
        return entry_to_dict(self)

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> ServerEntry:
        """Build from YAML-shaped data (schema-valid); ValueError when the KV settings are invalid."""
        return cast(ServerEntry, entry_from_dict(name, data, cls))


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

    def supervised(self) -> dict[str, ServerEntry | GatewayEntry]:
        """Every process the daemon runs, by name: the servers, then the gateway if there is one."""
        from veloxd.config.gateway import GATEWAY_NAME, GatewayEntry

        extra = {GATEWAY_NAME: GatewayEntry(self.gateway)} if self.gateway is not None else {}
        return {**self.servers, **extra}
