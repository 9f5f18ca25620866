"""A distributed group's KV memory figure, from each rank's. Stdlib only (the worker's rank 0
reports it in READY; the daemon and the gateway read it as one worker's)."""

from __future__ import annotations

from typing import Any


def group_kv_memory(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """A group's `kv_memory` from each rank's (same shape as one worker's): bytes summed over the
    ranks, ratios recomputed from the sums, labelled as a sum (`summed_over_ranks`, `source`)."""
    first = figures[0]

    def summed(key: str, digits: int | None) -> dict[str, Any]:
        return {kind: round(sum(f[key][kind] for f in figures), digits) for kind in ("method", "fp16")}

    at: dict[str, Any] = {}
    for n in first["at"]:
        method, fp16 = (sum(f["at"][n][kind] for f in figures) for kind in ("method", "fp16"))
        at[n] = {"method": method, "fp16": fp16, "ratio": round(method / fp16, 4) if fp16 else None}
    caps = sorted({cap for f in figures for cap in f.get("eviction_cap_tokens") or []})
    capped = [f["capped_bytes"] for f in figures if f.get("capped_bytes") is not None]
    return {
        **first,
        "fixed_bytes": summed("fixed_bytes", None),
        "bytes_per_token": summed("bytes_per_token", 1),
        "eviction_cap_tokens": caps or None,
        "capped_bytes": sum(capped) if capped else None,
        "at": at,
        "summed_over_ranks": len(figures),
        "source": f"sum over {len(figures)} ranks of each rank's kv_memory (distributed.ranks[].kv_memory), "
        f"each {first.get('source', 'measured')}",
    }
