"""KVCacheConfig and the method registry: validation, round trips, and one source of truth."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support import run_python
from veloxd.kv import KVCacheConfig, registry
from veloxd.kv.config import OWN_KEYS, SHARED, fields_for, override_fields_for, parse_value, settings


def test_defaults_resolve_bits_per_method() -> None:
    assert KVCacheConfig("fp16").bits is None
    for name in registry.methods_with_bits():
        info = registry.get(name)
        assert KVCacheConfig(name).bits == info.default_bits
        assert info.default_bits in info.bits_choices


@pytest.mark.parametrize("method", registry.names())
def test_every_method_round_trips_through_dicts(method: str) -> None:
    config = KVCacheConfig(method)
    assert KVCacheConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["method"] == method


def test_non_default_overrides_round_trip_and_are_reported() -> None:
    config = KVCacheConfig("kivi", bits=2, kivi_group_size=64, kivi_residual_length=256)
    again = KVCacheConfig.from_dict(config.to_dict())
    assert again == config
    assert config.overrides() == {"kivi_group_size": 64, "kivi_residual_length": 256}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "h2o", "kivi_group_size": 64}, "kivi_group_size applies to method kivi, not h2o"),
        (
            {"method": "h2o", "affine_group_size": 32},
            "not h2o; to keep h2o's tokens as affine codes use method h2o_affine",
        ),
        ({"method": "kivi", "bits": 3}, "bits=3 is not valid for method kivi"),
        ({"method": "affine", "affine_group_size": 48}, "affine_group_size=48 for method affine"),
        ({"method": "snapkv", "snapkv_budget": 0}, "snapkv_budget=0 for method snapkv: must be >= 1"),
        ({"method": "affine", "seed": True}, "seed must be int, not bool"),
        ({"method": "affine", "affine_rotate": 1}, "affine_rotate must be bool, not int"),
        ({"method": "kivi", "kivi_residual_length": 100}, "multiple of kivi_group_size"),
        ({"method": "h2o", "h2o_window": 2048}, "h2o_window=2048 for method h2o: must be below h2o_budget"),
        ({"method": "nope"}, "unknown method 'nope'"),
        ({"method": "turbo_quant_mse"}, "did you mean 'turboquant_mse'?"),
    ],
)
def test_invalid_configs_raise_value_error_naming_field_and_method(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("?", r"\?")):
        KVCacheConfig(**kwargs)


def test_irrelevant_field_left_at_its_default_is_accepted() -> None:
    assert KVCacheConfig("h2o", kivi_group_size=32).method == "h2o"


def test_from_dict_rejects_unknown_keys_with_a_suggestion() -> None:
    with pytest.raises(ValueError, match="unknown field 'kivi_groupsize'; did you mean 'kivi_group_size'"):
        KVCacheConfig.from_dict({"method": "kivi", "kivi_groupsize": 64})
    with pytest.raises(ValueError, match="missing field 'method'"):
        KVCacheConfig.from_dict({"bits": 4})


def test_config_is_frozen() -> None:
    config = KVCacheConfig("affine")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.bits = 8  # type: ignore[misc]


def test_every_field_has_complete_metadata_and_a_valid_default() -> None:
    names = set(registry.names())
    for f in settings():
        meta = f.metadata
        assert meta["help"] and meta["kind"] in (int, float, bool, str), f.name
        assert meta["methods"] and set(meta["methods"]) <= names, f.name
        if meta["choices"] is not None and f.default is not None:
            assert f.default in meta["choices"], f.name
        if f.name not in (*OWN_KEYS, *SHARED):
            # a hybrid method (snapkv_affine) takes the settings of its parts, each with its prefix
            prefixes = [{p.split("_")[0] for p in registry.parts(m)} for m in meta["methods"]]
            assert all(any(f.name.startswith(p) for p in ps) for ps in prefixes), f"{f.name} lacks its method prefix"


def test_registry_fields_are_derived_from_config_metadata() -> None:
    assert fields_for("kivi") == ("bits", "kivi_group_size", "kivi_residual_length")
    assert fields_for("fp16") == ()
    assert "seed" in fields_for("turboquant_mse") and "seed" not in fields_for("kivi")
    assert override_fields_for("affine") == ("recent_window", "affine_group_size", "affine_key_bits", "affine_rotate")
    assert "recent_window" in override_fields_for("turboquant_mse") and "recent_window" not in fields_for("kivi")
    assert "recent_window" not in fields_for("qjl")


def test_registry_flags_are_honest_values() -> None:
    for name in registry.names():
        info = registry.get(name)
        assert info.storage in ("fp16", "packed", "evicted")
        assert info.trimmable in ("yes", "until_eviction", "no")
        assert info.paper
        assert (info.storage == "fp16") == (name == "fp16")
        if info.family == "eviction":
            assert info.storage == "evicted" and info.trimmable == "until_eviction"


def test_parse_value_types_strings_by_field() -> None:
    assert parse_value("kivi_group_size", "64") == 64
    assert parse_value("affine_rotate", "yes") is True
    assert parse_value("affine_key_bits", "none") is None
    with pytest.raises(ValueError, match="affine_rotate must be true or false"):
        parse_value("affine_rotate", "maybe")


def test_config_and_registry_import_no_mlx() -> None:
    code = "import sys, veloxd.kv, veloxd.kv.config, veloxd.kv.registry; print('mlx' in sys.modules)"
    out = run_python(code, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
