"""`snapkv`: at the end of prefill, keep the prompt tokens an observation window attends to most.

Paper: SnapKV: LLM Knows What You are Looking for Before Generation (Li et al., 2024, arXiv
2404.14469). The last `snapkv_window` prompt queries score every earlier token (softmax
weights summed over the window and the GQA group sharing a KV head, ranking-equivalent to the
mean), scores are smoothed by max pooling of width `snapkv_kernel`, and each KV head keeps its
top `snapkv_budget - snapkv_window` tokens plus the window. `snapkv_pyramid` gives layers
PyramidKV budgets (Cai et al., 2024, arXiv 2406.02069): decreasing arithmetically from the
first to the last layer (ratio `snapkv_pyramid_beta`), with `snapkv_budget` as their average.
As the paper means it, the prompt is scored by the real last `snapkv_window` queries of the
whole prompt, whatever the prefill chunking: every chunk's queries go through a stash that keeps
the last `window` real ones (per row), nothing is evicted while the prompt is prefilled, and
the prompt is compressed once it has ended, at the first one-token step (mlx_lm runs a prompt's
last token as that step). So one chunk and many chunks keep the same tokens.
Memory, honestly: while a prompt is prefilled a layer holds all of it in fp16, as the fp16 cache
does, plus the stash (window x Hq x D); it drops to the budget when the prompt ends. Attention
during prefill is bounded per call by a block (veloxd.kv.ops.blockwise).
Deviations: the paper compresses once and lets decode grow; here decode re-compresses at the end
of every `window` decode steps when over budget, scoring with those steps' queries, so a layer
never holds more than budget + window tokens while decoding. Pooling runs over retained tokens
in position order (after an earlier compression, neighbours may be far apart). After a trim,
the window holds only the stashed queries before the cut until new ones arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import mlx.core as mx

from veloxd.kv.base import Batchable, LayerSpec, register_cache_class
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.evict import attention
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.engine import EvictionCache, Step
from veloxd.kv.evict.slots import EMPTY


def pyramid_budgets(budget: int, window: int, n_layers: int, beta: int) -> list[int]:
    """PyramidKV per-layer budgets: window + an arithmetic sequence from 2p - p/beta down to
    p/beta (p = budget - window), rounded so that their mean is exactly `budget`."""
    prefix = budget - window
    if n_layers == 1:
        return [budget]
    low = prefix / beta
    high = 2 * prefix - low
    total, rounded, sizes = 0.0, 0, []
    for i in range(n_layers):
        total += high - i * (high - low) / (n_layers - 1)
        sizes.append(round(total) - rounded)
        rounded = round(total)
    return [window + s for s in sizes]


def _group_sum(probs: mx.array, qs: int, qe: int) -> mx.array:
    """Weight per key summed over the GQA group and the queries: [B, Hkv, n]."""
    return probs.sum(axis=(2, 3))


def layer_budget(config: KVCacheConfig, index: int, n_layers: int) -> int:
    if not config.snapkv_pyramid:
        return config.snapkv_budget
    budgets = pyramid_budgets(config.snapkv_budget, config.snapkv_window, n_layers, config.snapkv_pyramid_beta)
    return budgets[index]


@register_cache_class
class SnapKVCache(Batchable, EvictionCache):
    """Per-slot "obs": weight received from the current decode window's queries."""

    row_lists = (*EvictionCache.row_lists, "prefilling", "filled")
    row_fill: ClassVar[Mapping[str, int]] = {"stash_pos": -1}
    _scale = 1.0  # the layer's attention scale, seen in attend (stash scoring reuses it)

    def __init__(self, config: KVCacheConfig, layer: LayerSpec) -> None:
        super().__init__(config, layer)
        self.prefilling = [False]  # a multi-token step ran and the prompt has not ended yet
        self.filled = [0]  # decode queries in the current observation window

    def layer_budget(self) -> int:
        return layer_budget(self.config, self.layer.index, self.layer.n_layers)

    def capacity_limit(self) -> int:
        """Decode slots: budget + one observation window (a prompt is held whole until it ends)."""
        return self.budget + self.config.snapkv_window

    def new_extras(self, keys: mx.array, values: mx.array) -> dict[str, mx.array]:
        return {"obs": mx.zeros(keys.shape[:3], dtype=mx.float32)}  # [B, Hkv, L]

    def run_attention(self, queries: mx.array, scale: float, step: Step) -> mx.array:
        self._scale = scale
        keys, values, mask = self.attention_view(step)
        if step.length > 1:
            out = attention.attend(queries, keys, values, scale, mask, self.block, decode_block=self.decode_block)
        else:
            out, obs = attention.received(
                queries, keys, values, scale, mask, _group_sum, self.block, decode_block=self.decode_block
            )
            self.slots["obs"] = self.slots["obs"] + self.widen(obs)  # [B, Hkv, C]
        if step.length > 1 or any(self.prefilling):
            self._stash(queries, mx.where(step.qvalid(), step.qpos(), -1))
        return out

    def enforce(self, step: Step) -> None:
        budget, window = self.budget, self.config.snapkv_window
        if step.length > 1:  # the prompt goes on: nothing is scored before its last queries exist
            self.prefilling = [p or h > a for p, a, h in zip(self.prefilling, step.lo, step.hi)]
            return
        ends = list(self.prefilling)  # this token ends the prompt
        filled = [0 if e else f + 1 for e, f in zip(ends, self.filled)]
        use_stash = [e and c > budget for e, c in zip(ends, self.counts)]
        use_window = [f >= window and c > budget for f, c in zip(filled, self.counts)]
        rows = [a or b for a, b in zip(use_stash, use_window)]
        if any(rows):
            scores = self.slots["obs"]
            if any(use_stash):
                scores = mx.where(mx.array(use_stash)[:, None, None], self._stash_scores(), scores)
            self._compress(rows, scores)
        reset = [e or f >= window for e, f in zip(ends, filled)]
        self.filled = [0 if r else f for r, f in zip(reset, filled)]
        if any(reset):
            self.slots["obs"] = mx.where(mx.array(reset)[:, None, None], 0.0, self.slots["obs"])
        self.prefilling = [False] * len(ends)
        self.rows = {}  # every row is decoding now: the stash is released

    def on_trim(self, cut: int) -> None:
        if self.rows:
            self.rows["stash_pos"] = mx.where(self.rows["stash_pos"] >= cut, -1, self.rows["stash_pos"])

    def _stash(self, queries: mx.array, qpos: mx.array) -> None:
        """Keep the `window` latest real queries [B, Hq, w, D] per row (qpos [B, L], -1 = padding)."""
        window = self.config.snapkv_window
        if not self.rows:
            B, n_q, _, D = queries.shape
            self.rows = {
                "stash_q": mx.zeros((B, n_q, window, D), dtype=queries.dtype),
                "stash_pos": mx.full((B, window), -1, dtype=mx.int32),
            }
        cand_q = mx.concatenate([self.rows["stash_q"], queries], axis=2)  # [B, Hq, w + L, D]
        cand_pos = mx.concatenate([self.rows["stash_pos"], qpos.astype(mx.int32)], axis=1)  # [B, w + L]
        top = mx.argsort(-cand_pos, axis=-1)[:, :window]  # [B, w] newest first
        self.rows = {
            "stash_q": mx.take_along_axis(cand_q, top[:, None, :, None], axis=2),
            "stash_pos": mx.take_along_axis(cand_pos, top, axis=1),
        }

    def _stash_scores(self) -> mx.array:
        """Weight each slot receives from the stashed window queries [B, Hkv, C]."""
        mask = attention.slot_mask(self.slots["positions"], self.rows["stash_pos"])
        stash_q, keys = self.rows["stash_q"], self.operands()[0]
        _, scores = attention.received(
            stash_q, keys, None, self._scale, mask, _group_sum, self.block, decode_block=self.decode_block
        )
        return scores  # [B, Hkv, C]

    def _compress(self, rows: list[bool], scores: mx.array) -> None:
        window = self.recent(self.config.snapkv_window)
        free = self.slots["positions"] == EMPTY
        # Pool over neighbours in position order, not slot order: a batch row's slots are not in
        # position order (decode fills free slots left before a later chunk by merge or padding),
        # and pooling by slot made batched rows keep other tokens than the same request alone.
        order = mx.argsort(self.slots["positions"], axis=-1)  # [B, Hkv, C]: free slots (EMPTY) last
        by_position = mx.take_along_axis(mx.where(window | free, 0.0, scores), order, axis=-1)
        pooled_by_position = attention.max_pool(by_position, self.config.snapkv_kernel)
        pooled = mx.take_along_axis(pooled_by_position, mx.argsort(order, axis=-1), axis=-1)  # back to slot order
        keep = [min(c, self.budget) if r else c for r, c in zip(rows, self.counts)]
        self.compact(mx.where(window, mx.inf, pooled), keep)
        self.mark_evicted(rows)


class SnapKVBatchCache(EvictionBatch, SnapKVCache, batches=SnapKVCache):
    """Several requests' snapkv rows: what SnapKVCache.merge returns."""
