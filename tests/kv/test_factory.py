"""`make_caches`: fresh caches per call, native caches kept for non-plain layers, no recursion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models import llama

from tests.support import run_python
from veloxd.kv import KVCacheConfig, make_caches
from veloxd.kv.base import VeloxCache
from veloxd.kv.factory import per_request


def tiny_llama(layer_types: list[str] | None = None) -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=len(layer_types or [0, 0]),
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-5,
        vocab_size=97,
        layer_types=layer_types,
        sliding_window=8 if layer_types else None,
    )
    return llama.Model(args)


def test_fp16_returns_the_models_own_caches() -> None:
    caches = make_caches(tiny_llama(), KVCacheConfig("fp16"))
    assert [type(c) for c in caches] == [mlx_cache.KVCache, mlx_cache.KVCache]


def test_each_call_builds_fresh_caches_for_every_layer() -> None:
    model = tiny_llama()
    config = KVCacheConfig("affine", bits=8)
    first, second = make_caches(model, config), make_caches(model, config)
    assert all(isinstance(c, VeloxCache) for c in first)
    assert all(a is not b for a, b in zip(first, second))
    assert [c.layer.index for c in first] == [0, 1]
    assert {c.layer.n_layers for c in first} == {2}


def test_sliding_window_layers_keep_their_native_cache() -> None:
    model = tiny_llama(["full_attention", "sliding_attention", "full_attention"])
    caches = make_caches(model, KVCacheConfig("affine", bits=8))
    assert isinstance(caches[0], VeloxCache) and isinstance(caches[2], VeloxCache)
    assert type(caches[1]) is mlx_cache.RotatingKVCache
    assert [caches[0].layer.index, caches[2].layer.index] == [0, 1]
    tokens = mx.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    logits = model(tokens, cache=caches)
    assert logits.shape == (1, 12, 97)


def test_the_workers_instance_make_cache_is_skipped_and_does_not_recurse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker sets model.make_cache to `per_request`; the factory's lookup skips it."""
    model = tiny_llama()
    monkeypatch.setattr(model, "make_cache", per_request(model, KVCacheConfig("affine", bits=4)))
    caches = mlx_cache.make_prompt_cache(model)
    assert len(caches) == 2 and all(isinstance(c, VeloxCache) for c in caches)


def test_a_foreign_instance_make_cache_calling_make_caches_is_refused_not_recursed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Someone else's closure over make_caches would recurse: a clear error names the way out."""
    model = tiny_llama()
    config = KVCacheConfig("affine", bits=4)
    calls: list[int] = []

    def foreign() -> list[Any]:
        calls.append(1)
        return make_caches(model, config)

    monkeypatch.setattr(model, "make_cache", foreign)
    with pytest.raises(ValueError, match="calls back into veloxd's make_caches; set it with"):
        mlx_cache.make_prompt_cache(model)
    assert len(calls) == 2  # the outer call, then once from the factory's lookup


def test_an_instance_make_cache_gives_the_cache_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_llama()
    monkeypatch.setattr(model, "make_cache", lambda: [mlx_cache.RotatingKVCache(max_size=8), mlx_cache.KVCache()])
    caches = make_caches(model, KVCacheConfig("affine", bits=8))
    assert type(caches[0]) is mlx_cache.RotatingKVCache and isinstance(caches[1], VeloxCache)


def test_compressed_attention_matches_fp16_closely_at_8_bits() -> None:
    model = tiny_llama()
    tokens = mx.array([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])
    reference = model(tokens, cache=make_caches(model, KVCacheConfig("fp16")))
    compressed = model(tokens, cache=make_caches(model, KVCacheConfig("affine", bits=8)))
    assert float(mx.abs(reference - compressed).max()) < 0.05 * float(mx.abs(reference).max())


def test_saved_compressed_cache_loads_back_in_a_fresh_process(tmp_path: Path) -> None:
    """veloxd.kv.load_prompt_cache registers every method's classes before mlx_lm looks them up."""
    from mlx_lm.models.cache import save_prompt_cache

    model = tiny_llama()
    caches = make_caches(model, KVCacheConfig("kivi", bits=4, kivi_residual_length=32))
    model(mx.array([list(range(40))]), cache=caches)
    path = tmp_path / "prompt.safetensors"
    save_prompt_cache(str(path), caches)
    code = (
        "from veloxd.kv import load_prompt_cache\n"
        f"caches = load_prompt_cache({str(path)!r})\n"
        "print([type(c).__name__ for c in caches], [c.offset for c in caches])\n"
    )
    out = run_python(code)
    assert out.stdout.strip() == "['KIVICache', 'KIVICache'] [40, 40]", out.stderr


@pytest.fixture
def source_reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every object `inspect.getsource` is asked for from now on (attention's per-module verdicts
    forgotten first, so routing really reads the sources, as at a worker's start)."""
    import inspect

    from veloxd.kv import attention

    attention.module_verdict.cache_clear()
    reads: list[object] = []
    real = inspect.getsource

    def recording(obj: Any, *args: Any, **kwargs: Any) -> str:
        reads.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "getsource", recording)
    return reads


def test_a_request_after_wiring_reads_no_model_source(source_reads: list[object]) -> None:
    """Routing is installed once at wiring; a request (make_cache, make_prompt_cache) touches no inspect."""
    from veloxd.serve.wiring import wire_caches

    model = tiny_llama()
    config = KVCacheConfig("affine", bits=4)
    wire_caches(model, config)
    assert source_reads, "wiring must read the model's source to route it (else this test proves nothing)"
    source_reads.clear()
    for caches in (model.make_cache(), mlx_cache.make_prompt_cache(model), make_caches(model, config)):
        assert len(caches) == 2 and all(isinstance(c, VeloxCache) for c in caches)
    assert source_reads == []


def test_install_reads_each_module_once_per_process(source_reads: list[object]) -> None:
    from veloxd.kv import attention

    attention.install(tiny_llama())
    first = len(source_reads)
    attention.install(tiny_llama())
    assert first >= 1 and len(source_reads) == first
