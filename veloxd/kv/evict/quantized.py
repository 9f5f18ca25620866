"""The hybrid methods: each eviction policy over affine codes (`<policy>_affine` in the registry).

Every class is the policy's own class with `AffineSlots` (veloxd.kv.evict.packed) in front, so
the policy's scoring and eviction are untouched and only what a slot stores changes; each has
its batch class beside it (what `merge` returns), as the policy modules do. The module doc of
veloxd.kv.evict.packed states the storage, the papers and the deviations.
"""

from __future__ import annotations

from veloxd.kv.base import register_cache_class
from veloxd.kv.evict.batch import EvictionBatch
from veloxd.kv.evict.h2o import H2OCache
from veloxd.kv.evict.knorm import KNormCache
from veloxd.kv.evict.packed import AffineSlots
from veloxd.kv.evict.snapkv import SnapKVCache
from veloxd.kv.evict.streaming import StreamingLLMCache
from veloxd.kv.evict.tova import TOVACache


@register_cache_class
class StreamingLLMAffineCache(AffineSlots, StreamingLLMCache):
    """streaming_llm_affine: sinks + recent window, stored as affine codes."""


class StreamingLLMAffineBatchCache(EvictionBatch, StreamingLLMAffineCache, batches=StreamingLLMAffineCache):
    """Several requests' streaming_llm_affine rows."""


@register_cache_class
class KNormAffineCache(AffineSlots, KNormCache):
    """knorm_affine: low-norm keys + recent window, stored as affine codes."""


class KNormAffineBatchCache(EvictionBatch, KNormAffineCache, batches=KNormAffineCache):
    """Several requests' knorm_affine rows."""


@register_cache_class
class SnapKVAffineCache(AffineSlots, SnapKVCache):
    """snapkv_affine: SnapKV's selection, stored as affine codes."""


class SnapKVAffineBatchCache(EvictionBatch, SnapKVAffineCache, batches=SnapKVAffineCache):
    """Several requests' snapkv_affine rows."""


@register_cache_class
class TOVAAffineCache(AffineSlots, TOVACache):
    """tova_affine: TOVA's selection, stored as affine codes."""


class TOVAAffineBatchCache(EvictionBatch, TOVAAffineCache, batches=TOVAAffineCache):
    """Several requests' tova_affine rows."""


@register_cache_class
class H2OAffineCache(AffineSlots, H2OCache):
    """h2o_affine: heavy hitters + recent window, stored as affine codes."""


class H2OAffineBatchCache(EvictionBatch, H2OAffineCache, batches=H2OAffineCache):
    """Several requests' h2o_affine rows."""
