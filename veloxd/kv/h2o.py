"""`h2o`: keep heavy hitters (most attention received so far) plus a window of recent tokens.

Paper: H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models
(Zhang et al., NeurIPS 2023, arXiv 2306.14048). Each KV head accumulates, per token, the
attention weight it has received from every query so far (summed over the GQA group sharing
the head); over budget, the lowest accumulator outside the `h2o_window` most recent tokens is
evicted. Prefill weights are computed in query blocks so memory is bounded by the block.
Deviations: a prefill chunk attends with nothing evicted inside it and evicts at its end, so
different chunkings can keep different tokens. Trimming is exact for the retained tokens, but
the accumulators keep what trimmed queries contributed (it cannot be subtracted).
"""

from __future__ import annotations

import mlx.core as mx

from veloxd.kv import eviction_attention as attention
from veloxd.kv.base import register_cache_class
from veloxd.kv.eviction import EvictionCache, Step
from veloxd.kv.eviction_batch import Batchable


@register_cache_class
class H2OCache(Batchable, EvictionCache):

    def layer_budget(self) -> int:
        return self.config.h2o_budget

    def new_extras(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        return {"mass": mx.zeros(keys.shape[:3], dtype=mx.float32)}  # [B, Hkv, L]

    def run_attention(self, queries: mx.array, scale: float, step: Step) -> mx.array:
        if step.length == 1:
            keys, values, vis = self.decode_view(step)
        else:
            keys, values = self.slots["keys"], self.slots["values"]
            chunk_vis = self.step_visibility(step)
            if isinstance(chunk_vis, str):  # weights need the mask as an array
                chunk_vis = attention.visible(self.slots["positions"][:, :1], step.qpos())
            vis = chunk_vis
        weight = step.qvalid().astype(mx.float32)  # padding queries contribute nothing
        out, mass = attention.column_mass(queries, keys, values, scale, vis, weight)
        self.slots["mass"] = self.slots["mass"] + self.widen(mass)
        return out

    def keep_priority(self, step: Step) -> mx.array:
        return mx.where(self.recent(self.config.h2o_window), mx.inf, self.slots["mass"])
