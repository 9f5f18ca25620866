"""`knorm`: keep the keys with the lowest L2 norm, plus a window of recent tokens; no queries.

Paper: A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (Devoto et al.,
EMNLP 2024, arXiv 2406.11430): keys with a low L2 norm tend to receive high attention, so the
highest-norm keys are evicted. RoPE is a rotation, so post-RoPE norms equal pre-RoPE ones.
Deviations: selection is per KV head (as kvpress' KnormPress); the `knorm_window` most
recent tokens are always kept; eviction runs whenever a step leaves more than `knorm_budget`
tokens (after the step's attention, so the step itself saw every retained token). Given the
same keys, any chunking of the prefill retains the same tokens (norms are fixed per token);
end to end on a model, later layers' keys depend on what earlier chunks could attend to.
"""

from __future__ import annotations

import mlx.core as mx

from veloxd.kv.base import Batchable, register_cache_class
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache, Step


@register_cache_class
class KNormCache(Batchable, EvictionCache):
    def layer_budget(self) -> int:
        return self.config.knorm_budget

    def new_extras(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        return {"norms": mx.sqrt(mx.sum(mx.square(keys.astype(mx.float32)), axis=-1))}  # [B, Hkv, L]

    def keep_priority(self, step: Step) -> mx.array:
        return mx.where(self.recent(self.config.knorm_window), mx.inf, -self.slots["norms"])


class KNormBatchCache(EvictionBatch, KNormCache, batches=KNormCache):
    """Several requests' knorm rows: what KNormCache.merge returns."""
