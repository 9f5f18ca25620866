"""`streaming_llm`: attention sinks plus a window of recent tokens, constant memory.

Paper: Efficient Streaming Language Models with Attention Sinks (Xiao et al., ICLR 2024,
arXiv 2309.17453). Each token attends to the first `streaming_llm_sinks` tokens and to the
`streaming_llm_window` tokens before it; everything else is evicted.
Deviations: keys keep the positions they were rotated at (the paper re-indexes positions
inside the cache), so decode matches mlx_lm's RotatingKVCache(max_size=sinks + window + 1,
keep=sinks). The sink + window visibility also holds inside a prefill chunk, so prefill in
any number of chunks gives the same outputs and the same retained tokens (the paper decodes
token by token).
"""

from __future__ import annotations

import mlx.core as mx

from veloxd.kv.base import Batchable, register_cache_class
from veloxd.kv.evict.attention import WindowRule
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache, Step


@register_cache_class
class StreamingLLMCache(Batchable, EvictionCache):
    uniform_heads = True

    def layer_budget(self) -> int:
        return self.config.streaming_llm_sinks + self.config.streaming_llm_window

    def window_rule(self) -> WindowRule:
        sinks, window = self.config.streaming_llm_sinks, self.config.streaming_llm_window
        return lambda k, q: (k < sinks) | (k >= q - window)

    def keep_priority(self, step: Step) -> mx.array:
        pos = self.slots["positions"][:, :1].astype(mx.float32)  # [B, 1, C]: same tokens in every head
        return mx.where(pos < self.config.streaming_llm_sinks, mx.inf, pos)


class StreamingLLMBatchCache(EvictionBatch, StreamingLLMCache, batches=StreamingLLMCache):
    """Several requests' streaming_llm rows: what StreamingLLMCache.merge returns."""
