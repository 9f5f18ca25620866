"""The qk-norm warning: which families normalise queries and keys, and which key codes warn.

docs/models.md ("Why gemma3_text and olmo2 lose more") measured TurboQuant under 4-bit keys and
QJL losing several times more on families whose attention normalises q and k per head; READY
says so (veloxd.kv.preflight.sharp_attention_warning). Tiny random-weight models of each family
(testkit.families), judged by the modules they build."""

from __future__ import annotations

import pytest

from testkit import families
from veloxd.kv import KVCacheConfig
from veloxd.kv.preflight import normalises_queries_and_keys, sharp_attention_warning

# Read off mlx_lm 0.32's model sources: attention modules holding q_norm/k_norm, or use_qk_norm.
QK_NORM = {"qwen3", "qwen3_moe", "qwen3_next", "olmo2", "exaone4", "gemma3_text", "gemma3n", "gemma4_text"}
QK_NORM |= {"llama4_text"}


@pytest.mark.parametrize("family", families.families())
def test_families_that_normalise_queries_and_keys_are_found(family: str) -> None:
    assert normalises_queries_and_keys(families.build(family)) is (family in QK_NORM)


@pytest.mark.parametrize(
    ("settings", "warns"),
    [
        ({"method": "qjl"}, True),
        ({"method": "turboquant_mse", "bits": 3}, True),
        ({"method": "turboquant_prod", "bits": 3}, True),
        ({"method": "turboquant_mse", "bits": 3, "turboquant_key_bits": 4}, False),  # the documented mitigation
        ({"method": "turboquant_mse", "bits": 4}, False),
        ({"method": "affine", "bits": 4}, False),
        ({"method": "kivi", "bits": 2}, False),
        ({"method": "snapkv"}, False),
    ],
)
def test_sharp_key_codes_warn_on_qk_norm_models_only(settings: dict, warns: bool) -> None:
    kv = KVCacheConfig(**settings)
    warning = sharp_attention_warning(families.build("olmo2"), kv)
    assert (warning is not None) is warns, warning
    if warning is not None:
        assert "model type 'olmo2'" in warning and kv.method in warning and "qk-norm" in warning
        assert "turboquant_key_bits: 4" in warning and "docs/models.md" in warning
    assert sharp_attention_warning(families.build("llama"), kv) is None
