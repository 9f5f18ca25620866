"""The dashboard's memory panel: the gateway's budget, what runs, each entry's need, and what admission
would do to start each stopped on-demand entry now. Pure: the daemon's memory table and the page's
server views in, plain data out (veloxd/gateway/admission.py makes the decision, as in the gateway).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veloxd.daemon.memory import kv_per_token_text
from veloxd.daemon.state import ServerState
from veloxd.gateway.admission import Admit, Resident, admit


def memory_view(table: Mapping[str, Any] | None, servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """None without a gateway (no budget to show); else the budget, use and one row per entry.

    The gateway unloads idle on-demand servers least recently used first; the page does not know
    their last use, so `would_unload` lists the ones admission may pick, in the table's order.
    """
    if not table:
        return None
    rows = table.get("servers") or {}
    residents = [
        Resident(
            name=name,
            need=int(row.get("total") or 0),
            on_demand=row.get("start") == "on_demand",
            busy=bool((servers.get(name) or {}).get("in_flight") or (servers.get(name) or {}).get("queued")),
            last_used=0.0,
        )
        for name, row in rows.items()
        if row.get("state") != ServerState.STOPPED.value
    ]
    budget = table.get("budget")
    entries = []
    for name, row in rows.items():
        entry = {
            "name": name,
            "start": row.get("start"),
            "state": row.get("state"),
            "need_bytes": row.get("total"),
            "weights_bytes": row.get("weights_bytes"),
            "weights_source": row.get("weights_source"),
            "kv_bytes": row.get("kv_bytes"),
            "kv_per_token": kv_per_token_text(row),
            "context_tokens": row.get("context_tokens"),
            "concurrency": row.get("concurrency"),
            "admission": None,
        }
        if row.get("start") == "on_demand" and row.get("state") == ServerState.STOPPED.value:
            decision = admit(name, int(row.get("total") or 0), residents, budget)
            entry["admission"] = (
                {"fits": True, "would_unload": list(decision.unload)}
                if isinstance(decision, Admit)
                else {"fits": False, "message": decision.message(name)}
            )
        entries.append(entry)
    return {
        "budget_bytes": budget,
        "budget_source": table.get("budget_source"),
        "in_use_bytes": table.get("in_use"),
        "always_over_budget": table.get("always_over_budget") or [],
        "entries": entries,
    }
