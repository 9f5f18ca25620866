"""Idle unloading: the gateway stops on-demand servers that had no request for their idle_unload_s.

One asyncio task sleeps until the first ready server is due (admission.next_idle), or until a
request ends or a view arrives (`Fleet.usage_changed`: either can move that time), then asks the
daemon to unload what is idle. The decision is admission.idle's, over the fleet's facts.
"""

from __future__ import annotations

import asyncio
import contextlib

from veloxd.daemon.control import DaemonUnreachable
from veloxd.daemon.state import ServerState
from veloxd.gateway import admission
from veloxd.gateway.events import emit
from veloxd.gateway.fleet import RETRY_S, Fleet


async def unload_when_idle(fleet: Fleet) -> None:
    while True:
        fleet.usage_changed.clear()
        try:
            await unload_idle(fleet)
        except DaemonUnreachable as err:
            emit("gateway_daemon_unreachable", "warning", error=str(err))
        except Exception as err:  # the task must outlive any surprise, or idle servers stay loaded
            emit("gateway_poll_failed", "error", error=repr(err))
        else:
            due = admission.next_idle(unloadable(fleet))
            timeout = None if due is None else max(0.0, due - fleet.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fleet.usage_changed.wait(), timeout)
            continue
        await asyncio.sleep(RETRY_S)


def unloadable(fleet: Fleet) -> list[admission.Resident]:
    """Ready servers the gateway has not asked to unload yet."""
    return [
        r
        for r in fleet.residents()
        if fleet.servers[r.name]["state"] == ServerState.READY.value and not fleet.slot(r.name).unloading
    ]


async def unload_idle(fleet: Fleet) -> None:
    for name in admission.idle(unloadable(fleet), fleet.clock()):
        fleet.slot(name).unloading = True
        answer = await fleet.daemon.unload(name, "idle")
        if not answer.get("ok"):
            emit("gateway_unload_failed", "warning", server=name, error=answer.get("error"))
        elif not answer.get("already"):
            fleet.tally.unloaded(name, "idle")
