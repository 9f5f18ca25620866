"""Refusal before load: what config.json shows a method cannot serve exits 2 before any weight is read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, run_veloxd
from veloxd.kv import KVCacheConfig
from veloxd.kv.preflight import check, head_dims

ASSET_CONFIG = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama" / "config.json"


def llama(**changes: Any) -> dict[str, Any]:
    return {**json.loads(ASSET_CONFIG.read_text()), **changes}


def test_head_dims_come_from_head_dim_or_hidden_size() -> None:
    assert head_dims(llama()) == (128, 128)
    assert head_dims({k: v for k, v in llama(hidden_size=320, num_attention_heads=4).items() if k != "head_dim"}) == (
        80,
        80,
    )
    assert head_dims({"model_type": "x"}) is None


@pytest.mark.parametrize(
    ("method", "fields", "dim", "expected"),
    [
        ("affine", {}, 80, "affine_group_size=64 for method affine: the model's key head dimension 80"),
        ("qjl", {}, 80, "qjl_value_group_size=64 for method qjl"),
        ("kivi", {"kivi_group_size": 64, "kivi_residual_length": 128}, 96, "kivi_group_size=64 for method kivi"),
        ("turboquant_mse", {}, 80, "the model's key head dimension 80 is not a multiple of 32"),
    ],
)
def test_head_dimension_the_group_sizes_do_not_divide_is_refused(
    method: str, fields: dict[str, Any], dim: int, expected: str
) -> None:
    with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
        check(llama(head_dim=dim), KVCacheConfig(method=method, **fields))


def test_servable_configs_pass_and_fp16_is_never_refused() -> None:
    for method in ("affine", "kivi", "turboquant_prod", "qjl", "snapkv", "h2o"):
        check(llama(), KVCacheConfig(method=method))
    check(llama(head_dim=80), KVCacheConfig(method="fp16"))
    check(llama(head_dim=80), KVCacheConfig(method="h2o"))  # eviction stores any head dimension


def test_attention_sinks_unroutable_and_unknown_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="attention-sink logits"):
        check({"model_type": "gpt_oss"}, KVCacheConfig(method="affine"))
    with pytest.raises(ValueError, match="model type 'plamo2' computes attention with MLX's fused kernel directly"):
        check({"model_type": "plamo2"}, KVCacheConfig(method="affine"))
    with pytest.raises(ValueError, match="unsupported architecture"):
        check({"model_type": "no_such_arch"}, KVCacheConfig(method="affine"))


def hub_cache(root: Path, repo: str, config: dict[str, Any]) -> Path:
    """A Hugging Face hub cache (HF_HUB_CACHE layout) holding config.json and unreadable weights."""
    org, name = repo.split("/")
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / f"models--{org}--{name}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors").write_bytes(b"not weights: reading this fails the load differently")
    return root


@pytest.mark.parametrize(
    ("config", "method", "expected"),
    [
        (llama(head_dim=80), "affine", "affine_group_size=64"),
        ({**llama(), "model_type": "gpt_oss"}, "kivi", "attention-sink logits"),
    ],
)
def test_hugging_face_id_is_refused_from_the_cached_config_before_weights(
    tmp_path: Path, config: dict[str, Any], method: str, expected: str
) -> None:
    cache = hub_cache(tmp_path / "hub", "veloxd-test/tiny", config)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    result = run_veloxd("serve", "--model", "veloxd-test/tiny", "--method", method, "--port", str(free_port()), env=env)
    assert result.returncode == 2, result.stderr
    assert f"cannot serve veloxd-test/tiny with method {method}" in result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and "safetensors" not in result.stderr


def family(name: str) -> dict[str, Any]:
    from testkit.families import config

    return config(name)


@pytest.mark.parametrize("name", ["smollm3", "mistral3", "gemma3_text", "qwen3_next", "gemma4_text"])
def test_wrappers_and_sliding_families_pass_before_load(name: str) -> None:
    for method in ("affine", "kivi", "turboquant_mse", "qjl"):
        check(family(name), KVCacheConfig(method=method))


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("gemma2", "model type 'gemma2' applies attention logit soft-capping"),
        ("gpt_oss", "model type 'gpt_oss' uses attention-sink logits"),
        ("gemma3n", "model type 'gemma3n' reads an earlier layer's cached keys and values back"),
    ],
)
def test_refusals_name_the_true_reason_and_the_way_out(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as raised:
        check(family(name), KVCacheConfig(method="affine"))
    assert "fused kernel" not in str(raised.value)
    assert "Serve it with method fp16" in str(raised.value)
    check(family(name), KVCacheConfig(method="fp16"))


def test_eviction_on_kv_shared_layers_is_refused_and_quantization_is_not() -> None:
    with pytest.raises(ValueError, match=r"model type 'gemma4_text' shares one layer's cache .*2 of its 4 layers"):
        check(family("gemma4_text"), KVCacheConfig(method="h2o"))
    check(family("gemma4_text"), KVCacheConfig(method="turboquant_prod"))


def test_the_pre_load_check_reads_no_weight_and_keeps_the_config(tmp_path: Path) -> None:
    config = family("mistral3")
    before = json.dumps(config, sort_keys=True)
    check(config, KVCacheConfig(method="affine"))
    assert json.dumps(config, sort_keys=True) == before  # ModelArgs edits nested dicts: a copy is built


def test_classify_reads_the_attention_from_source_text() -> None:
    from veloxd.kv import attention

    assert attention.classify("out = mx.fast.scaled_dot_product_attention(q, k, v)", True) == attention.FUSED
    assert attention.classify("scores = mx.tanh(scores / cap)\nmx.softmax(scores)", False) == attention.SOFTCAP
    assert attention.classify("w = mx.softmax(scores, axis=-1)", False) == attention.BY_HAND
    assert attention.classify("return self.model(x)", False) is None  # a wrapper: its parts decide
    assert attention.classify("sdpa(q, k, v, cache, sinks=self.sinks)", True) == attention.SINKS
    assert attention.classify("sdpa(q, k, v, cache, sinks=None)", True) is None
    assert attention.classify("k, v = cache.keys_and_values()", True) == attention.KV_READ_BACK
