"""READY's memory figure: fixed bytes and bytes per token measured at two probe lengths, totals
derived at longer contexts; checked against caches really filled to those lengths."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import load

from veloxd.kv import KVCacheConfig, make_caches, registry
from veloxd.kv.factory import native_caches
from veloxd.kv.footprint import measure

BUDGETS = {
    "streaming_llm": {"streaming_llm_window": 508},
    "knorm": {"knorm_budget": 512},
    "snapkv": {"snapkv_budget": 512},
    "tova": {"tova_budget": 512},
    "h2o": {"h2o_budget": 512},
}
BUDGETS |= {h.name: BUDGETS[h.parts[0]] for h in registry.HYBRIDS}  # each policy over affine codes
LENGTHS = (1024, 2048)  # multiples of the 256-token capacity step, past every budget above


@pytest.fixture(scope="module")
def model(tiny_model) -> Any:
    return load(str(tiny_model))[0]


def filled_bytes(model: Any, caches: list[Any], n: int) -> int:
    """Bytes held after a prompt of n - 1 tokens (chunks of 512) and its last token as a decode step."""
    vocab = model.args.vocab_size
    tokens = (mx.arange(n) * 31 % vocab)[None]
    for start in range(0, n - 1, 512):
        model(tokens[:, start : min(start + 512, n - 1)], cache=caches)
        mx.eval([c.state for c in caches])
    model(tokens[:, n - 1 :], cache=caches)
    mx.eval([c.state for c in caches])
    return sum(c.nbytes for c in caches)


@pytest.mark.parametrize("method", [m for m in registry.names() if m != "fp16"])
def test_derived_totals_match_caches_filled_to_those_lengths(model, method: str) -> None:
    config = KVCacheConfig(method=method, **BUDGETS.get(method, {}))
    footprint = measure(model, config)
    figure = footprint.to_dict()
    assert figure["max_context"] == model.args.max_position_embeddings
    assert set(figure["at"]) == {"4096", "32768", str(model.args.max_position_embeddings)}
    assert "measured" in figure["source"] and "derived" in figure["source"]
    for n in LENGTHS:
        derived = footprint.at(n)
        real_method = filled_bytes(model, make_caches(model, config), n)
        real_fp16 = filled_bytes(model, native_caches(model), n)
        assert abs(derived["method"] - real_method) <= 0.03 * real_method, (n, derived, real_method)
        assert abs(derived["fp16"] - real_fp16) <= 0.03 * real_fp16, (n, derived, real_fp16)
    if method in BUDGETS:  # capped: past the budget, more context costs nothing more
        assert figure["eviction_cap_tokens"] == [512]
        assert footprint.at(32768)["method"] == footprint.at(4096)["method"]
        assert footprint.at(4096)["ratio"] < 0.2
    else:
        assert figure["eviction_cap_tokens"] is None
        assert figure["bytes_per_token"]["method"] < figure["bytes_per_token"]["fp16"]
