"""The gateway's line to its daemon: one JSON request per connection on the control socket (asyncio)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

READ_LIMIT = 16 * 2**20  # a view of many entries is one long line


class DaemonGone(RuntimeError):
    """The daemon did not answer (it is restarting, or gone: the lifeline ends the gateway then)."""


class DaemonLink:
    def __init__(self, socket_path: str, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    async def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.socket_path, limit=READ_LIMIT), self.timeout_s
            )
        except (TimeoutError, OSError) as err:
            raise DaemonGone(f"cannot reach the daemon on {self.socket_path}: {err}") from None
        try:
            writer.write(json.dumps(payload).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), self.timeout_s)
        except (TimeoutError, OSError, ValueError) as err:
            raise DaemonGone(f"the daemon did not answer {payload.get('command')!r}: {err!r}") from None
        finally:
            writer.close()
        if not line:
            raise DaemonGone(f"the daemon closed the socket without answering {payload.get('command')!r}")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise DaemonGone(f"unexpected answer {answer!r}")
        return answer

    async def view(self) -> dict[str, Any]:
        return await self.request({"command": "gateway_view"})

    async def start(self, name: str, unload: tuple[str, ...]) -> dict[str, Any]:
        return await self.request({"command": "start", "name": name, "unload": list(unload)})

    async def unload(self, name: str, reason: str) -> dict[str, Any]:
        return await self.request({"command": "unload", "name": name, "reason": reason})
