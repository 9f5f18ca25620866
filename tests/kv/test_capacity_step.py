"""One capacity step for every store, mlx_lm's: the footprint's two-length fit is exact only then.

Contract with mlx_lm: `KVCache.step` (the fp16 reference's allocation step) equals veloxd's
CAPACITY_STEP; and each of veloxd's growing stores (packed token codes, batched token codes,
eviction slots, KIVI's quantized groups) takes its step from that one constant.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from veloxd.kv import KVCacheConfig
from veloxd.kv.config import field_named
from veloxd.kv.evict.slots import grow_target
from veloxd.kv.ops.packing import CAPACITY_STEP
from veloxd.kv.quant.kivi_rows import KIVIRows
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenQuantCache


def test_capacity_step_is_mlx_lm_kvcache_step() -> None:
    assert KVCache.step == CAPACITY_STEP
    assert KVCache().step == CAPACITY_STEP


def test_capacity_step_holds_whole_kivi_groups() -> None:
    """KIVI's quantized part grows in whole groups of every kivi_group_size it accepts."""
    choices = field_named("kivi_group_size").metadata["choices"]
    assert choices and all(CAPACITY_STEP % group == 0 for group in choices)


def test_every_store_grows_in_the_capacity_step() -> None:
    assert TokenQuantCache.step == CAPACITY_STEP
    assert TokenQuantBatchCache.step == CAPACITY_STEP
    assert grow_target(1, limit=10 * CAPACITY_STEP) == CAPACITY_STEP
    assert grow_target(CAPACITY_STEP + 1, limit=10 * CAPACITY_STEP) == 2 * CAPACITY_STEP
    rows = KIVIRows(KVCacheConfig(method="kivi", bits=2), k_dim=32, v_dim=32, dtype=mx.float16, batch=1, heads=1)
    rows.ensure_q_capacity(1)
    assert rows.q_capacity() == CAPACITY_STEP
    rows.ensure_q_capacity(CAPACITY_STEP + 1)
    assert rows.q_capacity() == 2 * CAPACITY_STEP
