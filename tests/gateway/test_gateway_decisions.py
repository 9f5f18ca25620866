"""The gateway's pure decisions with a fake clock: admission, idle unloading, memory needs, routing, ports."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from veloxd.config.gateway import ASSIGNED_PORTS, assign_port
from veloxd.daemon.memory import Need, default_budget, entry_need, kv_record, memory_table, render_table
from veloxd.gateway.admission import Admit, Refuse, Resident, admit, idle, next_idle
from veloxd.gateway.routing import routing_table

MB = 1_000_000


def resident(
    name: str,
    need: int,
    last_used: float,
    on_demand: bool = True,
    busy: bool = False,
    idle_unload_s: float | None = None,
) -> Resident:
    return Resident(name, need, on_demand, busy, last_used, idle_unload_s)


def test_admits_what_fits_without_unloading() -> None:
    assert admit("new", 4 * MB, [resident("a", 5 * MB, 0.0)], budget=10 * MB) == Admit(())


def test_unloads_idle_on_demand_servers_least_recently_used_first() -> None:
    residents = [
        resident("recent", 3 * MB, last_used=50.0),
        resident("oldest", 3 * MB, last_used=10.0),
        resident("older", 3 * MB, last_used=20.0),
    ]
    assert admit("new", 4 * MB, residents, budget=10 * MB) == Admit(("oldest",))
    assert admit("new", 7 * MB, residents, budget=10 * MB) == Admit(("oldest", "older"))


def test_never_unloads_always_or_busy_servers_and_says_why_it_refuses() -> None:
    """The message names what stays after unloading every idle on-demand server (an audit found it
    named every resident's need, idle ones included, as 'in use')."""
    residents = [
        resident("pinned", 6 * MB, 0.0, on_demand=False),
        resident("busy", 3 * MB, 0.0, busy=True),
        resident("idle", 5 * MB, 0.0),
    ]
    decision = admit("new", 4 * MB, residents, budget=12 * MB)
    assert decision == Refuse(4 * MB, 12 * MB, 14 * MB, "even after unloading every idle on-demand server", kept=9 * MB)
    assert decision.message("new") == (  # in units a person reads; the raw bytes are the error's fields
        "cannot start 'new': it needs 3.8 MiB of the memory budget of 11.4 MiB, and the servers that cannot be "
        "unloaded (start: always, or busy) need 8.6 MiB of it (even after unloading every idle on-demand server)"
    )
    huge = admit("huge", 11 * MB, [], budget=10 * MB)
    assert huge == Refuse(11 * MB, 10 * MB, 0, "more than the whole budget")
    assert (
        huge.message("huge") == "cannot start 'huge': it needs 10.5 MiB, more than the whole memory budget of 9.5 MiB"
    )


def test_the_server_being_admitted_does_not_count_against_itself() -> None:
    assert admit("a", 8 * MB, [resident("a", 8 * MB, 0.0)], budget=10 * MB) == Admit(())


def test_idle_follows_a_fake_clock() -> None:
    residents = [
        resident("short", MB, last_used=100.0, idle_unload_s=5.0),
        resident("long", MB, last_used=100.0, idle_unload_s=60.0),
        resident("never", MB, last_used=0.0),
        resident("busy", MB, last_used=0.0, busy=True, idle_unload_s=1.0),
        resident("pinned", MB, last_used=0.0, on_demand=False, idle_unload_s=1.0),
    ]
    assert idle(residents, now=104.9) == []
    assert idle(residents, now=105.0) == ["short"]
    assert idle(residents, now=160.0) == ["short", "long"]
    # When the idle-unload task wakes next: the first time at which `idle` names a server.
    assert next_idle(residents) == 105.0 and next_idle(residents[1:]) == 160.0
    assert next_idle(residents[2:]) is None  # nothing is due until a request ends (or a view arrives)


def test_need_is_weights_plus_kv_at_the_context_limit_times_concurrency(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 1000}))
    (model / "model-00001.safetensors").write_bytes(b"\0" * 3000)
    (model / "model-00002.safetensors").write_bytes(b"\0" * 2000)
    entry = SimpleNamespace(model=str(model), concurrency=4)
    unmeasured = entry_need(entry, None)
    assert (unmeasured.weights_bytes, unmeasured.weights_source, unmeasured.total) == (5000, "disk", 5000)
    measured = entry_need(entry, {"kv_bytes_per_token": 10.5, "weights_bytes": 4000})
    assert measured.weights_source == "loaded" and measured.total == 4000 + int(10.5 * 1000 * 4)
    missing = entry_need(SimpleNamespace(model="someone/not-downloaded", concurrency=1), None)
    assert missing.total is None and missing.weights_source == "unknown" and missing.context_tokens == 4096


def test_an_evicting_cache_is_billed_for_what_it_holds_at_the_context_limit(tmp_path: Path) -> None:
    """READY's kv_memory, not bytes per token x context: a SnapKV entry holds its budget however long
    the context, and a quantizer's fixed bytes count too."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    entry = SimpleNamespace(model=str(model), concurrency=2)
    ready_kv_memory = {  # the shape of READY's kv_memory (veloxd.kv.footprint) for an evicting method
        "fixed_bytes": {"method": 0, "fp16": 0},
        "bytes_per_token": {"method": 4096.0, "fp16": 4096.0},  # probes inside the budget: fp16's rate
        "capped_bytes": 4_300_000,
        "at": {"4096": {"method": 4_300_000, "fp16": 16_777_216}, "8192": {"method": 4_300_000, "fp16": 33_554_432}},
    }
    measured = {"kv_bytes_per_token": 4096.0, **kv_record(ready_kv_memory)}
    need = entry_need(entry, measured)
    assert need.kv_bytes == 2 * 4_300_000  # not 2 x 4096 x 8192
    other_context = {**measured, "kv_at": {"4096": 4_300_000}}  # no total at 8192: the capped line
    assert entry_need(entry, other_context).kv_bytes == 2 * 4_300_000
    quantizer = {"kv_bytes_per_token": 1000.0, "kv_fixed_bytes": 5000}
    assert entry_need(entry, quantizer).kv_bytes == 2 * (5000 + 1000 * 8192)
    older = {"kv_bytes_per_token": 1000.0}  # measurements.json from before kv_memory was kept
    assert entry_need(entry, older).kv_bytes == 2 * 1000 * 8192


def test_default_budget_is_a_fraction_of_memory_or_the_smaller_working_set() -> None:
    assert default_budget(64 * 2**30, None) == 48 * 2**30
    assert default_budget(64 * 2**30, 40 * 2**30) == 40 * 2**30
    assert default_budget(None, None) is None


def test_memory_table_flags_always_servers_beyond_the_budget() -> None:
    needs = {
        "a": Need(6 * MB, "disk", None, 10, 1),
        "b": Need(6 * MB, "disk", None, 10, 1),
        "c": Need(6 * MB, "disk", None, 10, 1),
    }
    servers = {
        "a": SimpleNamespace(start="always"),
        "b": SimpleNamespace(start="on_demand"),
        "c": SimpleNamespace(start="always"),
    }
    lookup = {id(e): needs[n] for n, e in servers.items()}
    table = memory_table(servers, {"a": "ready"}, lambda e: lookup[id(e)], 10 * MB, "gateway.memory_budget")
    assert table["in_use"] == 6 * MB and table["always_over_budget"] == ["c"]
    text = "\n".join(render_table(table))
    assert "budget 9.5 MiB (gateway.memory_budget)" in text and "on_demand" in text and "warning" in text


def test_routing_names_aliases_and_unambiguous_model_ids() -> None:
    servers = {
        "coder": {"model": "org/coder-7b", "aliases": ["code"]},
        "chat": {"model": "/models/shared", "aliases": ["talk"]},
        "chat2": {"model": "/models/shared", "aliases": []},
    }
    routes = routing_table(servers)
    assert routes["coder"] == "coder" and routes["code"] == "coder" and routes["org/coder-7b"] == "coder"
    assert routes["talk"] == "chat" and routes["chat2"] == "chat2"
    assert "/models/shared" not in routes and "shared" not in routes  # two servers: ambiguous, not routed


def test_assigned_ports_are_stable_per_name_and_skip_taken_ones() -> None:
    low, high = ASSIGNED_PORTS
    port = assign_port("coder", set())
    assert low <= port <= high and assign_port("coder", set()) == port
    assert assign_port("coder", {port}) == (port + 1 if port < high else low)
    with pytest.raises(ValueError, match="no free port"):
        assign_port("coder", set(range(low, high + 1)))


def test_the_daemon_never_imports_the_http_stack_or_mlx() -> None:
    import subprocess
    import sys

    code = (
        "import sys, veloxd.daemon.daemon, veloxd.daemon.ondemand, veloxd.cli.config, veloxd.daemon.views; "
        "print(sorted(m for m in ('aiohttp', 'mlx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
