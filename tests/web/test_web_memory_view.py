"""The dashboard's memory panel data and the capped KV figures, as pure functions over plain data."""

from __future__ import annotations

from typing import Any

from veloxd.daemon.memory import kv_per_token_text, render_table
from veloxd.kv.footprint import summary
from veloxd.web.memory_view import memory_view

MB = 1_000_000


def row(state: str, start: str, total: int, **extra: Any) -> dict[str, Any]:
    return {
        "state": state,
        "start": start,
        "total": total,
        "weights_bytes": total,
        "weights_source": "disk",
        "kv_bytes": 0,
        "kv_bytes_per_token": 1024.0,
        "kv_bytes_per_sequence": None,
        "context_tokens": 4096,
        "concurrency": 1,
        **extra,
    }


def table(**rows: dict[str, Any]) -> dict[str, Any]:
    in_use = sum(r["total"] for r in rows.values() if r["state"] != "stopped")
    return {
        "budget": 10 * MB,
        "budget_source": "gateway.memory_budget",
        "in_use": in_use,
        "servers": rows,
        "always_over_budget": [],
    }


def test_memory_view_says_what_admission_would_do_for_each_stopped_on_demand_entry() -> None:
    t = table(
        pinned=row("ready", "always", 5 * MB),
        idle=row("ready", "on_demand", 3 * MB),
        busy=row("ready", "on_demand", 1 * MB),
        small=row("stopped", "on_demand", 1 * MB),
        big=row("stopped", "on_demand", 4 * MB),
        huge=row("stopped", "on_demand", 11 * MB),
    )
    view = memory_view(t, {"busy": {"in_flight": 1}})
    assert view is not None and (view["budget_bytes"], view["in_use_bytes"]) == (10 * MB, 9 * MB)
    decided = {e["name"]: e["admission"] for e in view["entries"]}
    assert decided["pinned"] is None and decided["idle"] is None  # running: nothing to decide
    assert decided["small"] == {"fits": True, "would_unload": []}
    assert decided["big"] == {"fits": True, "would_unload": ["idle"]}  # never the busy one, never `always`
    assert decided["huge"]["fits"] is False
    assert (
        decided["huge"]["message"]
        == "cannot start 'huge': it needs 10.5 MiB, more than the whole memory budget of 9.5 MiB"
    )
    assert memory_view(None, {}) is None  # no gateway: no budget, no panel


def test_an_evicting_cache_measured_flat_reads_capped_never_a_bare_zero() -> None:
    assert kv_per_token_text(row("ready", "always", MB)) == "1024 B"
    capped = row("ready", "always", MB, kv_bytes_per_token=0.0, kv_bytes_per_sequence=352256)
    assert kv_per_token_text(capped) == "capped (344.0 KiB a sequence)"
    assert kv_per_token_text(row("stopped", "on_demand", MB, kv_bytes_per_token=None)) == "unmeasured"
    lines = render_table(table(snap=capped))
    assert "  capped (344.0 KiB a sequence)  " in lines[-1]


def test_ready_summary_carries_the_cap_and_the_ratio_length() -> None:
    """READY's short form (status, dashboard, metrics read it): snapkv_affine with a 256-token budget."""
    figure = {
        "bytes_per_token": {"method": 0.0, "fp16": 4096.0},
        "eviction_cap_tokens": [256],
        "capped_bytes": 352256,
        "at": {"4096": {"method": 352256, "fp16": 16777216, "ratio": 0.021}},
    }
    short = summary(figure)
    assert (short["method"], short["cap_tokens"], short["capped_bytes"], short["tokens"]) == (0.0, 256, 352256, 4096)
    plain = summary({**figure, "eviction_cap_tokens": None, "capped_bytes": None})
    assert plain["cap_tokens"] is None and plain["capped_bytes"] is None
