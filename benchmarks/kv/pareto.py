"""Pareto front of (stored bytes per token, KL): no other arm is at least as small in both and smaller in one."""

from __future__ import annotations

from typing import Any


def front(rows: list[dict[str, Any]], x: str = "stored_vs_fp16", y: str = "kl_mean") -> list[str]:
    """Labels of the rows on the front (rows lacking either figure are ignored), by increasing x."""
    points = [(r[x], r[y], r["label"]) for r in rows if r.get(x) is not None and r.get(y) is not None]
    on_front = []
    for px, py, label in points:
        dominated = any(qx <= px and qy <= py and (qx < px or qy < py) for qx, qy, _ in points)
        if not dominated:
            on_front.append((px, py, label))
    return [label for _, _, label in sorted(on_front)]
