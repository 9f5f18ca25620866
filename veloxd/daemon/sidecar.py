"""The dashboard process (`veloxd web`), supervised like a server: same states, backoff and lifeline.

The daemon never imports an HTTP stack; when veloxd.yaml has a `dashboard:` block it runs
`python -m veloxd web` as a child under the one Supervisor (in a lane of its own), so a dashboard
that crashes is restarted with backoff and never touches a model server. It speaks the worker
protocol: binds its port, prints `VELOXD_READY {json}`, answers GET /health, exits when the
lifeline closes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veloxd.config.plan import Plan
from veloxd.config.sections import Dashboard, RestartPolicy
from veloxd.daemon.supervisor import Supervisor
from veloxd.launch import veloxd_argv

NAME = "@dashboard"  # never a server name (those start with a letter or digit): no clash in logs or messages
LANE = "dashboard"  # its rollouts do not queue behind the servers'
# The keys of the state file's `dashboard` (a server's snapshot has more: model, KV, downloads).
SHOWN = (
    "state",
    "pid",
    "host",
    "port",
    "since",
    "restarts",
    "last_exit",
    "last_error",
    "last_error_at",
    "start_time",
    "pgid",
    "stop_timeout_s",
)


@dataclass(frozen=True)
class DashboardEntry:
    """The dashboard process as the supervisor sees an entry (veloxd.daemon.supervised.Supervised)."""

    host: str
    port: int
    state_dir: str
    api_key_env: str | None
    interval_s: float
    history: int
    name: str = NAME
    method: str = ""  # no model, no KV cache: empty, so no download phase and nothing to show
    model: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    start: str = "always"
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 5.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)

    @classmethod
    def from_config(cls, block: Dashboard, state_dir: Path) -> DashboardEntry:
        return cls(
            host=block.host,
            port=block.port,
            state_dir=str(state_dir),
            api_key_env=block.api_key_env,
            interval_s=block.interval_s,
            history=block.history,
        )

    @property
    def program(self) -> list[str]:
        return veloxd_argv("web")

    @property
    def kv(self) -> None:  # no KV cache: its READY line carries no settings to check
        return None

    @property
    def health(self) -> None:  # no liveness probes after READY
        return None

    @property
    def distributed(self) -> None:
        return None

    def serve_argv(self) -> list[str]:
        argv = [
            "--state-dir",
            self.state_dir,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--interval-s",
            str(self.interval_s),
            "--history",
            str(self.history),
        ]
        return argv + (["--api-key-env", self.api_key_env] if self.api_key_env else [])


class DashboardSidecar:
    """Starts, restarts on change, and stops the dashboard process as the config says."""

    def __init__(self, supervisor: Supervisor, state_dir: Path) -> None:
        self.supervisor = supervisor
        self.entry: DashboardEntry | None = None
        self._state_dir = state_dir

    def apply(self, block: Dashboard | None, now: float) -> None:
        """Follow the config's `dashboard:` block: start it, restart it with new settings, or stop it."""
        new = DashboardEntry.from_config(block, self._state_dir) if block is not None else None
        old = self.entry
        if new == old:
            return
        if old is None:
            plan = Plan(added=(NAME,))
        elif new is None:
            plan = Plan(removed=(NAME,))
        else:
            plan = Plan(changed={NAME: ("dashboard",)})
        self.entry = new
        self.supervisor.apply(plan, {NAME: new} if new is not None else {}, now, lane=LANE)


def dashboard_snapshot(servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The dashboard's process facts for the state file, from the Supervisor's snapshot (None: none)."""
    snap = servers.get(NAME)
    return None if snap is None else {key: snap[key] for key in SHOWN}
