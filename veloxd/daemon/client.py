"""The async client of the daemon's control socket: the one the gateway process holds.

The gateway (its view, on-demand starts and unloads) and the dashboard's monitor (status, log
events, the page's actions) share one `DaemonClient`; `veloxd web` makes its own from the state
directory. One request per connection, one JSON line each way (veloxd/daemon/control.py). Connect
and every read have a timeout; whatever goes wrong on the way is `DaemonUnreachable`, naming the
socket and the command. The command line's blocking client is `control.request`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from veloxd.daemon.control import MAX_ANSWER_BYTES, REQUEST_TIMEOUT_S, DaemonUnreachable, socket_path_of

CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = REQUEST_TIMEOUT_S + 10.0  # the daemon answers, or says it did not, within REQUEST_TIMEOUT_S


class DaemonClient:
    """The control socket of one daemon: found from its state directory (`veloxd web`), or at a
    known path (the gateway, which the daemon tells where its socket is)."""

    def __init__(
        self,
        state_dir: Path | None = None,
        socket: Path | str | None = None,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self.state_dir = state_dir
        self.socket = Path(socket) if socket is not None else None
        self.connect_timeout_s = connect_timeout_s
        self.answer_timeout_s = answer_timeout_s

    def path(self) -> Path:
        """Where the daemon listens (the state file may name a new socket after a restart)."""
        path = self.socket or (socket_path_of(self.state_dir) if self.state_dir is not None else None)
        if path is None:
            raise DaemonUnreachable(f"no veloxd daemon found: {self.state_dir} names no control socket")
        return path

    async def ask(self, payload: dict[str, Any], wait_s: float = 0.0) -> dict[str, Any]:
        """The daemon's answer to `payload`; `wait_s`: how long the daemon may hold it on purpose."""
        path, command = self.path(), payload.get("command")
        # A daemon that reads the request only after this client gave up drops it (control.py).
        payload = {**payload, "expires_at": time.time() + self.connect_timeout_s * 2 + wait_s + self.answer_timeout_s}
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(path), limit=MAX_ANSWER_BYTES), self.connect_timeout_s
            )
        except (TimeoutError, OSError) as err:
            raise DaemonUnreachable(f"no veloxd daemon is listening on {path} ({_reason(err)})") from None
        try:
            writer.write(json.dumps(payload).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), self.connect_timeout_s)
            line = await asyncio.wait_for(reader.readline(), wait_s + self.answer_timeout_s)
        except (TimeoutError, OSError, ValueError) as err:  # ValueError: a line over MAX_ANSWER_BYTES
            raise DaemonUnreachable(f"the daemon on {path} did not answer {command!r} ({_reason(err)})") from None
        finally:
            writer.close()
        if not line:
            raise DaemonUnreachable(f"the daemon closed {path} without answering {command!r}")
        try:
            answer = json.loads(line)
        except ValueError as err:
            raise DaemonUnreachable(f"the daemon on {path} answered {command!r} with no JSON ({err})") from None
        if not isinstance(answer, dict):
            raise DaemonUnreachable(f"the daemon on {path} answered {command!r} with {answer!r}")
        return answer

    async def view(self, known: str | None = None, wait_s: float = 0.0) -> dict[str, Any]:
        """The gateway's view; given `known` (the etag of the view held), the daemon answers when its
        view differs from that one or after `wait_s` (veloxd/daemon/longpoll.py)."""
        return await self.ask({"command": "gateway_view", "known": known, "wait_s": wait_s}, wait_s)

    async def start(self, name: str, unload: tuple[str, ...]) -> dict[str, Any]:
        return await self.ask({"command": "start", "name": name, "unload": list(unload)})

    async def unload(self, name: str, reason: str) -> dict[str, Any]:
        return await self.ask({"command": "unload", "name": name, "reason": reason})


def _reason(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    return getattr(err, "strerror", None) or str(err) or type(err).__name__
