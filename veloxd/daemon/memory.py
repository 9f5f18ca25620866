"""What a server needs in memory, and the budget all running servers share (stdlib and psutil only).

need = weights + KV bytes of one sequence at the context limit x concurrency, where
- weights: the loaded size the worker reported (READY `memory.weights_bytes`), else the size of
  the model's weight files on disk (a local directory or the Hugging Face cache);
- KV bytes of one sequence: READY's `kv_memory` total at the context limit (derived from the
  measured fixed bytes, bytes per token and, for eviction methods, the bytes held at the budget),
  else fixed + bytes per token x context, no more than the capped bytes an evicting cache holds;
  remembered per model, method and bits in the state directory (measurements.json); unmeasured:
  counted as 0 until measured. Bytes per token alone would bill an eviction method for a context
  it never holds;
- context tokens: the context length the model's config.json states (veloxd.model_config: the
  worker's rule, text_config of a wrapper model included), else DEFAULT_CONTEXT (4096);
- concurrency: the entry's `concurrency` (the gateway never forwards more requests at once).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from veloxd.checks import gib
from veloxd.daemon.statefile import read_state
from veloxd.files import write_json_atomic
from veloxd.model_config import stated_context_length

MEASUREMENTS_FILE = "measurements.json"  # in the state directory, next to state.json
BUDGET_FRACTION = 0.75  # of physical memory: the OS, the daemon and the gateway keep the rest
DEFAULT_CONTEXT = 4096  # tokens billed for a model whose config states no context length
WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf", ".bin")


@dataclass(frozen=True)
class Need:
    """One entry's estimated resident memory; `total` is None when the weights are unknown."""

    weights_bytes: int | None
    weights_source: str  # "loaded" | "disk" | "unknown"
    kv_bytes_per_token: float | None
    context_tokens: int
    concurrency: int
    kv_bytes_per_sequence: int | None = None  # at context_tokens; None: per token x context

    @property
    def kv_bytes(self) -> int:
        if self.kv_bytes_per_sequence is not None:
            return self.kv_bytes_per_sequence * self.concurrency
        return int((self.kv_bytes_per_token or 0) * self.context_tokens * self.concurrency)

    @property
    def total(self) -> int | None:
        return None if self.weights_bytes is None else self.weights_bytes + self.kv_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_bytes": self.kv_bytes, "total": self.total}


def measurement_key(model: str, method: str, bits: int | None) -> str:
    return f"{model}|{method}|{bits}"


def model_dir(model: str) -> Path | None:
    """The local directory holding `model`'s files: the path itself, or its complete Hugging Face snapshot."""
    from veloxd.download.cache import is_hub_model, local_snapshot

    if is_hub_model(model):
        return local_snapshot(model, os.environ)
    path = Path(model).expanduser()
    return path if path.is_dir() else None


def weights_on_disk(model: str) -> int | None:
    directory = model_dir(model)
    if directory is None:
        return None
    total = 0
    for file in directory.rglob("*"):
        if file.name.endswith(WEIGHT_SUFFIXES):
            try:
                total += file.stat().st_size  # follows the HF cache's symlinks into blobs/
            except OSError:
                continue
    return total or None


def context_tokens(model: str) -> int:
    directory = model_dir(model)
    try:
        config = json.loads((directory / "config.json").read_text()) if directory else {}
    except (OSError, ValueError):
        config = {}
    stated = stated_context_length(config) if isinstance(config, dict) else None
    return DEFAULT_CONTEXT if stated is None else stated


def entry_need(entry: Any, measured: Mapping[str, Any] | None) -> Need:
    """The need of a ServerEntry given its remembered measurement (None: never measured)."""
    measured = measured or {}
    weights, source = measured.get("weights_bytes"), "loaded"
    if not isinstance(weights, int):
        weights, source = weights_on_disk(entry.model), "disk"
        if weights is None:
            source = "unknown"
    kv = measured.get("kv_bytes_per_token")
    context = context_tokens(entry.model)
    return Need(
        weights_bytes=weights,
        weights_source=source,
        kv_bytes_per_token=float(kv) if isinstance(kv, (int, float)) else None,
        context_tokens=context,
        concurrency=int(entry.concurrency),
        kv_bytes_per_sequence=kv_bytes_at(measured, context),
    )


def kv_record(kv_memory: Mapping[str, Any]) -> dict[str, Any]:
    """What measurements.json keeps of READY's `kv_memory` (the method's side; see kv_bytes_at)."""
    record = {
        "kv_fixed_bytes": (kv_memory.get("fixed_bytes") or {}).get("method"),
        "kv_capped_bytes": kv_memory.get("capped_bytes"),
        "kv_at": {n: at["method"] for n, at in (kv_memory.get("at") or {}).items() if isinstance(at, dict)},
    }
    return {k: v for k, v in record.items() if v not in (None, {})}


def kv_bytes_at(measured: Mapping[str, Any], context: int) -> int | None:
    """One sequence's KV bytes at `context` tokens from a measurement (None: nothing measured)."""
    at = measured.get("kv_at") or {}
    if isinstance(at.get(str(context)), (int, float)):
        return int(at[str(context)])
    per_token = measured.get("kv_bytes_per_token")
    if not isinstance(per_token, (int, float)) or "kv_fixed_bytes" not in measured:
        return None  # a record from before kv_memory: per token x context, as it always was
    line = measured["kv_fixed_bytes"] + per_token * context
    capped = measured.get("kv_capped_bytes")
    return int(min(line, capped) if isinstance(capped, (int, float)) else line)


def memory_table(
    servers: Mapping[str, Any],
    states: Mapping[str, str],
    need: Callable[[Any], Need],
    budget: int | None,
    budget_source: str,
) -> dict[str, Any]:
    """Every entry's need and state, the budget, what running entries use, and `always` entries over budget."""
    rows = {
        name: {**need(entry).to_dict(), "state": states.get(name, "stopped"), "start": entry.start}
        for name, entry in servers.items()
    }
    in_use = sum(r["total"] or 0 for r in rows.values() if r["state"] != "stopped")
    over, total = [], 0
    for name, row in rows.items():
        if row["start"] == "always":
            total += row["total"] or 0
            if budget is not None and total > budget:
                over.append(name)
    return {
        "budget": budget,
        "budget_source": budget_source,
        "in_use": in_use,
        "servers": rows,
        "always_over_budget": over,
    }


def budget_for(gateway: Any, measurements: Mapping[str, Any]) -> tuple[int | None, str]:
    """The budget in force and where it comes from."""
    if gateway is not None and gateway.memory_budget is not None:
        return int(gateway.memory_budget), "gateway.memory_budget"
    working_set = measurements.get("recommended_working_set_bytes")
    budget = default_budget(physical_memory(), working_set if isinstance(working_set, int) else None)
    return budget, f"default: {int(BUDGET_FRACTION * 100)}% of physical memory" + (
        " or MLX's recommended working set" if working_set else ""
    )


def kv_per_token_text(row: Mapping[str, Any]) -> str:
    """KV/TOKEN of the memory table; an evicting cache measured flat says it is capped, never a bare 0 B."""
    per_token, per_sequence = row["kv_bytes_per_token"], row.get("kv_bytes_per_sequence")
    if per_token is None:
        return "unmeasured"
    if per_token < 1 and per_sequence:
        return f"capped ({gib(per_sequence)} a sequence)"
    return f"{per_token:.0f} B"


def render_table(table: Mapping[str, Any]) -> list[str]:
    """The memory table as text lines (`veloxd status`, `veloxd plan`)."""
    # in_use is the NEED of the running servers (what admission counts), not a reading of memory
    lines = [
        f"memory: budget {gib(table['budget'])} ({table['budget_source']}), running servers need {gib(table['in_use'])}"
    ]
    header = ("NAME", "START", "STATE", "NEED", "WEIGHTS", "KV/TOKEN", "CONTEXT", "CONCURRENCY")
    rows = [header]
    for name, row in table["servers"].items():
        kv = kv_per_token_text(row)
        rows.append(
            (
                name,
                row["start"],
                row["state"],
                gib(row["total"]),
                f"{gib(row['weights_bytes'])} ({row['weights_source']})",
                kv,
                str(row["context_tokens"]),
                str(row["concurrency"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if table["always_over_budget"]:
        lines.append(
            "warning: servers with start: always do not fit the budget from "
            f"{table['always_over_budget'][0]} on: {', '.join(table['always_over_budget'])}"
        )
    return lines


def read_measurements(state_dir: Path) -> dict[str, Any]:
    """What READY lines measured, remembered in the state directory ({} when none or unreadable)."""
    try:
        data = json.loads((Path(state_dir) / MEASUREMENTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_measurements(state_dir: Path, measurements: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a lost measurement is measured again at the next READY
        write_json_atomic(Path(state_dir) / MEASUREMENTS_FILE, dict(measurements))


def offline_table(config: Any, state_dir: Path) -> dict[str, Any]:
    """The memory table for a config outside the daemon (`check`, `plan`): remembered measurements, last states."""
    measurements = read_measurements(state_dir)
    servers = (read_state(state_dir) or {}).get("servers") or {}
    states = {n: s.get("state", "stopped") for n, s in servers.items() if isinstance(s, dict)}

    def need(entry: Any) -> Need:
        return entry_need(entry, measurements.get(measurement_key(entry.model, entry.method, entry.kv.bits)))

    budget, source = budget_for(config.gateway, measurements)
    return memory_table(config.servers, states, need, budget, source)


def physical_memory() -> int | None:
    import psutil

    try:
        return int(psutil.virtual_memory().total)
    except (OSError, RuntimeError):
        return None


def default_budget(physical: int | None, recommended_working_set: int | None) -> int | None:
    """BUDGET_FRACTION of physical memory, or MLX's recommended working set when that is smaller."""
    candidates = [int(physical * BUDGET_FRACTION)] if physical else []
    if recommended_working_set:
        candidates.append(int(recommended_working_set))
    return min(candidates) if candidates else None
