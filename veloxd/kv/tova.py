"""`tova`: over budget, drop the token the current query attends to least (averaged over heads).

Paper: Transformers are Multi-State RNNs (Oren et al., 2024, arXiv 2401.06104), Token Omission
Via Attention. One decision per layer: the weights of every query head are averaged, and the
same token leaves every KV head. The token just added may be the one dropped.
Deviations: a prefill chunk attends with nothing evicted inside it, then keeps the
`tova_budget` tokens the chunk's last query attends to most (the paper's per-token policy
applied once at the chunk's end), so different chunkings can keep different tokens.
"""

from __future__ import annotations

import mlx.core as mx

from veloxd.kv import eviction_attention as attention
from veloxd.kv.base import register_cache_class
from veloxd.kv.eviction import EvictionCache, Step
from veloxd.kv.eviction_batch import Batchable


@register_cache_class
class TOVACache(Batchable, EvictionCache):
    uniform_heads = True
    _scores: mx.array | None = None  # this step's head-averaged weights [B, 1, C], for enforce

    def layer_budget(self) -> int:
        return self.config.tova_budget

    def run_attention(self, queries: mx.array, scale: float, step: Step) -> mx.array:
        if step.length == 1:
            keys, values, vis = self.decode_view(step)
            out, probs = attention.weighted(queries, keys, values, scale, vis)
        else:
            keys, values = self.slots["keys"], self.slots["values"]
            out = attention.fused(queries, keys, values, scale, self.step_visibility(step))
            if not any(c > self.budget for c in self.counts):
                return out
            last = mx.array([max(h - 1, 0) for h in step.hi], dtype=mx.int32)  # last real query per row
            q_last = mx.take_along_axis(queries, last[:, None, None, None], axis=2)  # [B, Hq, 1, D]
            qpos = mx.array(step.base)[:, None] + last[:, None]  # [B, 1]
            vis = attention.visible(self.slots["positions"][:, :1], qpos)  # [B, 1, 1, S]
            probs = attention.weights(q_last, keys, scale, vis)
        self._scores = self.widen(probs.mean(axis=(1, 2, 3))[:, None])  # [B, 1, S]: averaged over all heads
        return out

    def keep_priority(self, step: Step) -> mx.array:
        scores, self._scores = self._scores, None
        assert scores is not None  # enforce asks only when a row is over budget, and then run_attention scored
        return scores
