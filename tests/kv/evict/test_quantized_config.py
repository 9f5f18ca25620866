"""The hybrid methods in the registry and in veloxd.yaml: which pairs exist, whose settings apply,
and the located errors of a bad entry (FILE:LINE:COL through the normal config validation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config_support import entry, issues, write_config
from veloxd import protocol
from veloxd.config import load_config
from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.config import KVConfigError
from veloxd.kv.factory import cache_class

HYBRIDS = [h.name for h in registry.HYBRIDS]


def test_registry_lists_each_policy_over_affine_and_no_other_pair() -> None:
    evicting = [m.name for m in registry.METHODS if m.family == "eviction"]
    assert [f"{p}_affine" for p in evicting] == HYBRIDS
    for name in HYBRIDS:
        info = registry.get(name)
        assert info.parts == (name.removesuffix("_affine"), "affine") and info.storage == "packed"
        assert info.bits_choices == registry.get("affine").bits_choices and info.batchable
        assert hasattr(cache_class(name), "merge") and "mx.quantize" in info.paper
    assert "SnapKV" in registry.get("snapkv_affine").paper and "Li et al., 2024" in registry.get("snapkv_affine").paper
    for quantizer in registry.QUANTIZERS_NOT_STORABLE:
        with pytest.raises(KVConfigError, match=f"snapkv over {quantizer} storage is not implemented") as err:
            KVCacheConfig(method=f"snapkv_{quantizer}")
        assert err.value.field == "method"


def test_a_hybrid_takes_the_settings_of_both_parts_and_no_other() -> None:
    kv = KVCacheConfig(
        method="h2o_affine", bits=2, affine_group_size=32, affine_key_bits=8, h2o_budget=64, h2o_window=16
    )
    assert kv.applied() == {
        "method": "h2o_affine",
        "bits": 2,
        "seed": 0,
        "affine_group_size": 32,
        "affine_key_bits": 8,
        "affine_rotate": True,
        "h2o_budget": 64,
        "h2o_window": 16,
    }
    for wrong in ({"kivi_group_size": 64}, {"turboquant_codebook": "uniform"}, {"snapkv_budget": 8}):
        with pytest.raises(KVConfigError, match="applies to method") as err:
            KVCacheConfig(method="h2o_affine", **wrong)
        assert err.value.field == next(iter(wrong))


BAD = [
    (
        "unimplemented-pair",
        "method: snapkv_kivi",
        (
            6,
            13,
            "$.servers.coder.method",
            "snapkv over kivi storage is not implemented: KIVI quantizes keys per channel",
        ),
    ),
    (
        "setting-of-another-quantizer",
        "method: snapkv_affine\noverrides: {kivi_group_size: 64}",
        (
            7,
            17,
            "$.servers.coder.overrides.kivi_group_size",
            "kivi_group_size applies to method kivi, not snapkv_affine",
        ),
    ),
    (
        "bits-of-the-storage",
        "method: snapkv_affine\nbits: 5",
        (7, 11, "$.servers.coder.bits", "bits=5 is not valid for method snapkv_affine; choose one of [2, 3, 4, 6, 8]"),
    ),
    (
        "policy-cross-field",
        "method: snapkv_affine\noverrides:\n  snapkv_budget: 32\n  snapkv_window: 64",
        (
            9,
            22,
            "$.servers.coder.overrides.snapkv_window",
            "snapkv_window=64 for method snapkv_affine: must not exceed",
        ),
    ),
    (
        "bits-on-the-plain-policy",
        "method: tova\nbits: 4",
        (7, 11, "$.servers.coder.bits", "to keep tova's tokens as 4-bit codes use method tova_affine"),
    ),
]


@pytest.mark.parametrize(("body", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_hybrid_entry_fails_at_its_line_and_column(tmp_path: Path, body: str, expected: tuple) -> None:
    found = issues(write_config(tmp_path, entry(f"model: ./model\nport: 8081\n{body}"), dedent=False))
    assert len(found) == 1, found
    line, column, path, message = found[0]
    assert (line, column, path) == expected[:3] and expected[3] in message, found


def test_a_hybrid_entry_loads_with_the_settings_of_both_parts(tmp_path: Path) -> None:
    body = "method: snapkv_affine\nbits: 3\noverrides: {snapkv_budget: 256, affine_group_size: 32}"
    server = load_config(write_config(tmp_path, entry(f"model: ./model\nport: 8081\n{body}"), dedent=False))
    kv = server.servers["coder"].kv
    assert (kv.method, kv.bits, kv.snapkv_budget, kv.affine_group_size) == ("snapkv_affine", 3, 256, 32)
    argv = server.servers["coder"].serve_argv()
    assert KVCacheConfig.from_dict(protocol.read_entry_document(argv[1])["kv"]) == kv  # what the worker runs
