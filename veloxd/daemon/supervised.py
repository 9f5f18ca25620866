"""What the supervisor needs of an entry it runs: a model server, the gateway or the dashboard.

Three implementations, checked by mypy where the daemon hands them to the supervisor:
`ServerEntry` (veloxd.config.model; a `veloxd serve` worker), `GatewayEntry`
(veloxd.config.gateway; `veloxd gateway`) and `DashboardEntry` (veloxd.daemon.sidecar;
`veloxd web`). Every member is read as is: an entry without a model, a KV cache, a health
section or ranks says so with an empty string or None, never by lacking the attribute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from veloxd.config.sections import Distributed, Health, RestartPolicy
    from veloxd.kv.config import KVCacheConfig


class Supervised(Protocol):
    """One process the daemon keeps running (read-only members: frozen dataclasses implement them)."""

    @property
    def name(self) -> str: ...  # the key of logs, messages and the state file

    @property
    def host(self) -> str: ...  # where it binds: port checks, readiness and liveness probes

    @property
    def port(self) -> int: ...

    @property
    def model(self) -> str: ...  # "" or "-": no model, so no download step and no path to wait for

    @property
    def method(self) -> str: ...  # shown by status; the KV method for a model server

    @property
    def kv(self) -> KVCacheConfig | None: ...  # the settings its READY line must echo; None: no check

    @property
    def env(self) -> Mapping[str, str]: ...  # added to the daemon's environment for its process

    @property
    def api_key_env(self) -> str | None: ...  # a start condition, and a value scrubbed from its output

    @property
    def start(self) -> str: ...  # "always" or "on_demand"

    @property
    def ready_timeout_s(self) -> float: ...

    @property
    def stop_timeout_s(self) -> float: ...

    @property
    def restart(self) -> RestartPolicy: ...

    @property
    def health(self) -> Health | None: ...  # liveness probes once READY; None: none

    @property
    def distributed(self) -> Distributed | None: ...  # run as a group through MLX's launcher

    @property
    def program(self) -> Sequence[str] | None: ...  # None: the daemon's worker command (`veloxd serve`)

    def serve_argv(self) -> list[str]: ...  # the flags after the program (without the lifeline's)
