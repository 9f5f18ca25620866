"""`h2o`: keep heavy hitters (most attention received so far) plus a window of recent tokens.

Paper: H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models
(Zhang et al., NeurIPS 2023, arXiv 2306.14048). Each KV head accumulates, per token, the
attention weight it has received from every query so far (summed over the GQA group sharing
the head); over budget, the lowest accumulator outside the `h2o_window` most recent tokens is
evicted. Weights are reduced block by block in the attention pass (bounded by a block).
Deviations: a prefill chunk attends with nothing evicted inside it and evicts at its end, so
different chunkings can keep different tokens. Trimming is exact for the retained tokens, but
the accumulators keep what trimmed queries contributed (it cannot be subtracted).
"""

from __future__ import annotations

import mlx.core as mx

from veloxd.kv.base import Batchable, register_cache_class
from veloxd.kv.evict import attention
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache, Step


@register_cache_class
class H2OCache(Batchable, EvictionCache):
    def layer_budget(self) -> int:
        return self.config.h2o_budget

    def new_extras(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        return {"mass": mx.zeros(keys.shape[:3], dtype=mx.float32)}  # [B, Hkv, L]

    def run_attention(self, queries: mx.array, scale: float, step: Step) -> mx.array:
        keys, values, mask = self.attention_view(step)
        weight = step.qvalid().astype(mx.float32)  # [B, L]: padding queries contribute nothing

        def reduce(probs: mx.array, qs: int, qe: int) -> mx.array:  # summed over the GQA group and queries
            return (probs * weight[:, None, None, qs:qe, None]).sum(axis=(2, 3))  # [B, Hkv, n]

        out, mass = attention.received(
            queries, keys, values, scale, mask, reduce, self.block, decode_block=self.decode_block
        )
        self.slots["mass"] = self.slots["mass"] + self.widen(mass)
        return out

    def keep_priority(self, step: Step) -> mx.array:
        return mx.where(self.recent(self.config.h2o_window), mx.inf, self.slots["mass"])


class H2OBatchCache(EvictionBatch, H2OCache, batches=H2OCache):
    """Several requests' h2o rows: what H2OCache.merge returns."""
