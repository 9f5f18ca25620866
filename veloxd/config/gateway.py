"""The top-level `gateway:` block: one OpenAI endpoint in front of every server (docs/gateway.md).

The gateway runs as its own supervised process (`veloxd gateway`), so the daemon treats it like
a server entry: `GatewayEntry` implements what the supervisor reads of one (the Supervised
protocol of veloxd.daemon.supervised: name, host, port, timeouts, restart policy, its program).
Only host and port need a new process; every other key reaches the running gateway through the
control socket.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, cast

from veloxd.checks import SIZE_HELP
from veloxd.config.codec import flat_keys, section_from_dict, section_to_dict
from veloxd.config.keys import API_KEY_ENV_SCHEMA, HOST_SCHEMA, PORT_SCHEMA, key, seconds, size_key
from veloxd.config.sections import RestartPolicy
from veloxd.launch import veloxd_argv

GATEWAY_NAME = "@gateway"  # its name among supervised processes: never a valid entry name
# Ports of entries that leave `port` out come from this range: a hash of the name, probed upward.
# Below the ephemeral ranges (Linux 32768-60999, macOS 49152-65535): an outgoing connection's
# local port can never take an assigned port while its on-demand server is stopped.
ASSIGNED_PORTS = (28100, 28999)


@dataclass(frozen=True)
class Gateway:
    """The gateway's settings, defaults applied."""

    port: int = key(
        help="TCP port of the gateway's OpenAI-compatible API (the one base URL clients use).",
        schema=PORT_SCHEMA,
    )
    host: str = key(
        "127.0.0.1",
        help="Address the gateway binds. Loopback by default; any other address needs "
        "api_key_env, or allow_unauthenticated: true.",
        schema=HOST_SCHEMA,
    )
    api_key_env: str | None = key(
        None,
        help="Name of an environment variable of the daemon holding the bearer "
        "token clients must send to the gateway; unset: no authentication. Applies "
        "without a restart.",
        schema=API_KEY_ENV_SCHEMA,
        live=True,
    )
    allow_unauthenticated: bool = key(
        False,
        help="Set true to bind a non-loopback gateway host without api_key_env, deliberately.",
        schema={"type": "boolean"},
        live=True,
    )
    memory_budget: int | None = size_key(
        None,
        help=f"Memory the running servers may use together: {SIZE_HELP}. "
        "Unset: 75% of physical memory, or MLX's recommended working set on Apple "
        "silicon when that is smaller. On-demand servers are admitted within it.",
        live=True,
    )
    max_body_bytes: int = size_key(
        16_000_000,
        help=f"Largest request body the gateway accepts: {SIZE_HELP}; larger requests get 413.",
        live=True,
    )
    start_timeout_s: float = key(
        300.0,
        help="Seconds a request waits for its server to become ready (an "
        "on-demand start, a restart after a crash) before it gets 503 with Retry-After.",
        schema=seconds(86400),
        live=True,
    )

    header_timeout_s: float = key(
        10.0,
        help="Seconds a new connection has to send a complete request line and headers; then it is "
        "closed without an answer (a silent or slow client cannot hold a file descriptor).",
        schema=seconds(86400),
        live=True,
    )
    body_timeout_s: float = key(
        60.0,
        help="Seconds a request has to send its whole body once its headers are in; then it gets 408.",
        schema=seconds(86400),
        live=True,
    )
    keepalive_timeout_s: float = key(
        15.0,
        help="Seconds an idle keep-alive connection stays open waiting for its next request.",
        schema=seconds(86400),
        live=True,
    )
    connect_timeout_s: float = key(
        10.0,
        help="Seconds to open a connection to a server's worker; then the request gets 504.",
        schema=seconds(86400),
        live=True,
    )
    first_byte_timeout_s: float = key(
        600.0,
        help="Seconds from forwarding a request to the first byte of the worker's answer; then 504. "
        "A non-streamed answer starts only when generation is done, so this bounds a whole generation.",
        schema=seconds(86400),
        live=True,
    )
    read_timeout_s: float = key(
        120.0,
        help="Seconds between two reads from a worker once its answer has begun (streamed or not); then "
        "504, or an SSE error event when a stream has begun. Covers a long prompt's processing in a stream.",
        schema=seconds(86400),
        live=True,
    )
    max_connections: int = key(
        1000,
        help="Open client connections the gateway serves at once; a request on a connection beyond "
        "them gets 503. Keep it below the process's file limit (the installed service raises it).",
        schema={"type": "integer", "minimum": 1, "maximum": 1_000_000},
        live=True,
    )

    def to_dict(self) -> dict[str, Any]:
        return section_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gateway:
        """From schema-valid data, coerced key by key as a server entry's sections are."""
        return cast(Gateway, section_from_dict(cls, data))

    def process_key(self) -> dict[str, Any]:
        return {"gateway.host": self.host, "gateway.port": self.port}

    def live_key(self) -> dict[str, Any]:
        return {f"gateway.{name}": value for name, value in flat_keys(self, live=True).items()}


@dataclass(frozen=True)
class GatewayEntry:
    """The gateway as the supervisor sees a server: its own program, loopback health, readiness line."""

    gateway: Gateway
    name: str = GATEWAY_NAME
    method: str = "gateway"
    model: str = "-"
    start: str = "always"
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.gateway.host

    @property
    def port(self) -> int:
        return self.gateway.port

    @property
    def program(self) -> list[str]:
        """Replaces the worker command: the gateway is never a `veloxd serve`."""
        return veloxd_argv("gateway")

    # What a model server has and the gateway has not (veloxd.daemon.supervised.Supervised).
    @property
    def api_key_env(self) -> None:
        """gateway.api_key_env is a live key the gateway reads per request: no start condition."""
        return None

    @property
    def kv(self) -> None:
        return None

    @property
    def health(self) -> None:
        return None

    @property
    def distributed(self) -> None:
        return None

    def serve_argv(self) -> list[str]:
        return ["--host", self.host, "--port", str(self.port)]

    def process_key(self) -> dict[str, Any]:
        return self.gateway.process_key()

    def live_key(self) -> dict[str, Any]:
        return self.gateway.live_key()


def assign_port(name: str, taken: set[int]) -> int:
    """A port for an entry without one: stable for a name (a hash into ASSIGNED_PORTS), skipping `taken`."""
    low, high = ASSIGNED_PORTS
    size = high - low + 1
    start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % size
    for step in range(size):
        port = low + (start + step) % size
        if port not in taken:
            return port
    raise ValueError(f"no free port left in {low}-{high} for server '{name}'")
