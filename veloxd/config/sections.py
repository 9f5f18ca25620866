"""The nested blocks of a server entry (sampling, prompt_cache, limits, restart, health, distributed) and `dashboard:`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from veloxd import entry_bounds
from veloxd.checks import SIZE_HELP
from veloxd.config.keys import (
    API_KEY_ENV_SCHEMA,
    ENV_SCHEMA,
    HOST_SCHEMA,
    PATH_OR_NULL_SCHEMA,
    PORT_SCHEMA,
    key,
    seconds,
    size_key,
)


@dataclass(frozen=True)
class Sampling:
    temp: float = key(
        0.0,
        help="Sampling temperature for requests that set none; 0 is greedy.",
        schema=entry_bounds.TEMP,
    )
    top_p: float = key(
        1.0,
        help="Nucleus-sampling top-p for requests that set none; 1 keeps every token.",
        schema=entry_bounds.TOP_P,
    )
    max_tokens: int = key(
        512,
        help="Maximum tokens generated for requests that set no limit.",
        schema=entry_bounds.MAX_TOKENS,
    )


@dataclass(frozen=True)
class PromptCache:
    size: int = key(
        10,
        help="Distinct prompt KV caches kept for reuse across requests.",
        schema=entry_bounds.PROMPT_CACHE_SIZE,
    )
    bytes: int | None = size_key(
        None,
        help=f"Cap on the memory of the kept caches: {SIZE_HELP}; unset: no cap.",
    )


@dataclass(frozen=True)
class Limits:
    max_tokens: int | None = key(
        None,
        help="Most tokens one request may generate; a request asking for more "
        'gets this many (finish_reason "length"). null: the model\'s context length.',
        schema=entry_bounds.REQUEST_TOKENS,
    )
    max_prompt_tokens: int | None = key(
        None,
        help="Longest prompt accepted, in tokens; a longer one gets HTTP 400 "
        "naming both numbers, before any prefill. null: the model's context length.",
        schema=entry_bounds.REQUEST_TOKENS,
    )
    request_body_timeout_s: float = key(
        entry_bounds.REQUEST_BODY_TIMEOUT_S,
        help="Seconds a client has to send a request's body (a slower one gets 408), and, in "
        "total, its request line and headers (a slower one is disconnected).",
        schema=entry_bounds.REQUEST_BODY_TIMEOUT,
    )
    max_body_bytes: int = size_key(
        entry_bounds.MAX_BODY_BYTES,
        help=f"Largest request body accepted ({SIZE_HELP}); a larger Content-Length gets 413 before anything is read.",
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
        schema=seconds(86400),
    )
    backoff_initial_s: float = key(
        1.0,
        help="Delay before the first restart; it doubles after each failure.",
        schema=seconds(3600),
    )
    backoff_max_s: float = key(
        60.0,
        help="Longest delay between restarts; at least backoff_initial_s.",
        schema=seconds(86400),
    )


@dataclass(frozen=True)
class Health:
    """Liveness after READY: the daemon's periodic `GET /health` of a ready worker (docs/operations.md)."""

    interval_s: float = key(
        10.0,
        help="Seconds between health probes of a ready server.",
        schema=seconds(3600, minimum=0.1),
    )
    timeout_s: float = key(
        5.0,
        help="Seconds one probe may take (connect, request, answer) before it counts as failed.",
        schema=seconds(600),
    )
    failures: int = key(
        3,
        help="Consecutive failed probes after which the server is unresponsive: SIGTERM, SIGKILL "
        "after stop_timeout_s, then a restart with backoff as after a crash.",
        schema={"type": "integer", "minimum": 1, "maximum": 1000},
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
        schema=PATH_OR_NULL_SCHEMA,
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
        schema=entry_bounds.PARALLELISM,
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
        schema=PATH_OR_NULL_SCHEMA,
    )
    cwd: str | None = key(
        None,
        help="Working directory of the ranks on every host; unset: the daemon's, when it exists there.",
        schema=PATH_OR_NULL_SCHEMA,
    )
    env: Mapping[str, str] = key(
        factory=dict,
        help="Environment variables exported on every rank, remote "
        "ones included (the entry's env reaches only local ranks).",
        schema=ENV_SCHEMA,
    )


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
        schema=seconds(60, minimum=0.2),
    )
    history: int = key(
        900,
        help="Samples kept for the memory and tokens-per-second charts.",
        schema={"type": "integer", "minimum": 10, "maximum": 100000},
    )
