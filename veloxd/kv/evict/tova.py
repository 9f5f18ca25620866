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

from veloxd.kv.base import Batchable, register_cache_class
from veloxd.kv.evict import attention
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache, Step


@register_cache_class
class TOVACache(Batchable, EvictionCache):
    uniform_heads = True
    _scores: mx.array | None = None  # this step's head-averaged weights [B, 1, C], for enforce

    def layer_budget(self) -> int:
        return self.config.tova_budget

    def run_attention(self, queries: mx.array, scale: float, step: Step) -> mx.array:
        n_q = queries.shape[1]

        def reduce(probs: mx.array, qs: int, qe: int) -> mx.array:  # averaged over all query heads
            return probs.sum(axis=(1, 2, 3))[:, None] / n_q  # [B, 1, n]

        keys, values, mask = self.attention_view(step)
        if step.length == 1:
            out, scores = attention.received(
                queries, keys, values, scale, mask, reduce, self.block, decode_block=self.decode_block
            )
        else:
            out = attention.attend(queries, keys, values, scale, mask, self.block, decode_block=self.decode_block)
            if not any(c > self.budget for c in self.counts):
                return out
            last = mx.array([max(h - 1, 0) for h in step.hi], dtype=mx.int32)  # last real query per row
            q_last = mx.take_along_axis(queries, last[:, None, None, None], axis=2)  # [B, Hq, 1, D]
            qpos = mx.array(step.base)[:, None] + last[:, None]  # [B, 1]
            last_mask = attention.slot_mask(self.slots["positions"][:, :1], qpos)
            _, scores = attention.received(
                q_last, keys, None, scale, last_mask, reduce, self.block, decode_block=self.decode_block
            )
        self._scores = self.widen(scores)  # [B, 1, S]
        return out

    def enforce(self, step: Step) -> None:
        try:
            super().enforce(step)
        finally:
            self._scores = None  # this step's weights are never kept past it

    def keep_priority(self, step: Step) -> mx.array:
        assert self._scores is not None  # enforce asks only when a row is over budget, and then run_attention scored
        return self._scores

    def arrays(self) -> list[mx.array]:
        return [*super().arrays(), *([] if self._scores is None else [self._scores])]


class TOVABatchCache(EvictionBatch, TOVACache, batches=TOVACache):
    """Several requests' tova rows: what TOVACache.merge returns."""
