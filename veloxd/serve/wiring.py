"""Attach veloxd caches to a loaded model and measure what they hold.

Runs on mlx_lm's generation thread (MLX arrays belong to the thread that made them). One probe
cache list answers layer count and batchability; probe prefills at two lengths (veloxd.kv.footprint)
prove the method's attention runs on this model and measure its fixed bytes and bytes per token
next to the fp16 cache's, from which READY's `kv_memory` derives totals at 4k, 32k and the model's
maximum context.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veloxd.kv import KVCacheConfig, make_caches, registry
from veloxd.kv.factory import per_request
from veloxd.kv.footprint import measure, summary


@dataclass(frozen=True)
class Wiring:
    layer_caches: dict[str, int]
    batchable: bool
    kv_memory: dict[str, Any]
    kv_bytes_per_token: dict[str, Any]  # its short form (the console, dashboard and metrics read it)


def measured(model: Any, config: KVCacheConfig) -> dict[str, Any]:
    return measure(model, config).to_dict()


def wire_caches(
    model: Any, config: KVCacheConfig, figure_of: Callable[[Any, KVCacheConfig], dict[str, Any]] = measured
) -> Wiring:
    """Route attention (once), probe, measure (`figure_of`: the worker reuses a kept figure,
    veloxd.serve.figures), then make every request build a fresh cache list.

    Raises ValueError with the true reason if unservable. Routing is installed here, by the probe's
    make_caches; a request only builds caches (`per_request`) and reads no model source.
    """
    probe = make_caches(model, config)
    batchable = registry.get(config.method).batchable and all(hasattr(c, "merge") for c in probe)
    figure = figure_of(model, config)
    counts = Counter(type(c).__name__ for c in probe)
    # Instance attribute: mlx_lm's make_prompt_cache calls it per request. It is marked as ours,
    # so the factory's lookup of the model's own make_cache skips it and never recurses.
    model.make_cache = per_request(model, config)
    return Wiring(
        layer_caches=dict(counts),
        batchable=batchable,
        kv_memory=figure,
        kv_bytes_per_token=summary(figure),
    )
