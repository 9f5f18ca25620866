"""READY's memory figure: fixed bytes and bytes per token measured at two probe lengths, capped
bytes of evicting layers measured past the budget, totals derived at longer contexts; checked
against caches really filled to those lengths, at default-like and at small eviction budgets."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from testkit import families
from veloxd.kv import KVCacheConfig, make_caches, registry
from veloxd.kv.factory import native_caches
from veloxd.kv.footprint import measure

BUDGETS = {  # 512 retained tokens: past the 256/512 probes' reach, inside the filled lengths
    "streaming_llm": {"streaming_llm_window": 508},
    "knorm": {"knorm_budget": 512},
    "snapkv": {"snapkv_budget": 512},
    "tova": {"tova_budget": 512},
    "h2o": {"h2o_budget": 512},
}
BUDGETS |= {h.name: BUDGETS[h.parts[0]] for h in registry.HYBRIDS}  # each policy over affine codes
SMALL = {  # budgets inside one 256-token capacity step (tests/serve/test_serve_methods.py uses these)
    "streaming_llm": {"streaming_llm_sinks": 4, "streaming_llm_window": 64},
    "knorm": {"knorm_budget": 96, "knorm_window": 16},
    "snapkv": {"snapkv_budget": 96, "snapkv_window": 16},
    "tova": {"tova_budget": 96},
    "h2o": {"h2o_budget": 96, "h2o_window": 32},
}
ONE = {  # a budget of 1 (the smallest each allows; it crashed the probe: two lengths under the budget)
    "streaming_llm": {"streaming_llm_sinks": 0, "streaming_llm_window": 1},
    "knorm": {"knorm_budget": 1, "knorm_window": 0},
    "snapkv": {"snapkv_budget": 1, "snapkv_window": 1},
    "tova": {"tova_budget": 1},
}
LENGTHS = (768, 1024)  # multiples of the 256-token capacity step, past every budget above
DECODE = 40  # generated tokens after the prompt: past snapkv's re-compression window


@pytest.fixture(scope="module")
def real_fp16(model: Any) -> dict[int, int]:
    """Bytes of fp16 caches really filled to each of LENGTHS: the same for every method, filled once."""
    return {n: filled_bytes(model, native_caches(model), n)[-1] for n in LENGTHS}


def filled_bytes(model: Any, caches: list[Any], n: int, generated: int = 0) -> list[int]:
    """Bytes held after a prompt of n - 1 tokens (chunks of 512) and its last token as a decode
    step, then after each of `generated` further decode steps."""
    vocab = getattr(model.args, "vocab_size", 256)  # wrappers keep it in their text config
    tokens = (mx.arange(n + generated) * 31 % vocab)[None]
    for start in range(0, n - 1, 512):
        model(tokens[:, start : min(start + 512, n - 1)], cache=caches)
        mx.eval([c.state for c in caches])
    held = []
    for i in range(n - 1, n + generated):
        model(tokens[:, i : i + 1], cache=caches)
        mx.eval([c.state for c in caches])
        held.append(sum(c.nbytes for c in caches))
    return held


CASES = [pytest.param(m, BUDGETS.get(m, {}), id=m) for m in registry.names() if m != "fp16"]
CASES += [pytest.param(m, fields, id=f"{m}-small") for m, fields in SMALL.items()]
CASES += [pytest.param(m, fields, id=f"{m}-one") for m, fields in ONE.items()]


@pytest.mark.parametrize(("method", "fields"), CASES)
def test_derived_totals_match_caches_filled_to_those_lengths(
    model: Any, real_fp16: dict[int, int], method: str, fields: dict[str, Any]
) -> None:
    config = KVCacheConfig(method=method, **fields)
    footprint = measure(model, config)
    figure = footprint.to_dict()
    assert figure["max_context"] == model.args.max_position_embeddings
    assert set(figure["at"]) == {"4096", "32768", str(model.args.max_position_embeddings)}
    assert figure["source"] == "measured" and "measured" in figure["how"] and "derived" in figure["how"]
    # every layer's own cache is a KVCache: probes run the caches on random keys, not the weights,
    # and the figures below are checked against caches the model really filled
    assert footprint.synthetic and "no weights run" in figure["how"]
    evicting = registry.get(method).evicts
    for n in LENGTHS:
        derived = footprint.at(n)
        assert abs(derived["fp16"] - real_fp16[n]) <= 0.03 * real_fp16[n], (n, derived, real_fp16[n])
        if evicting:  # while decoding past its budget an evicting layer holds its capped bytes at most
            held = filled_bytes(model, make_caches(model, config), n, DECODE)
            real_method = max(held)
        else:
            real_method = filled_bytes(model, make_caches(model, config), n)[-1]
        assert abs(derived["method"] - real_method) <= 0.03 * real_method, (n, derived, real_method)
    if evicting:  # capped: past the budget, more context costs nothing more
        budget = make_caches(model, config)[0].budget
        assert figure["eviction_cap_tokens"] == [budget]
        assert figure["capped_bytes"] == footprint.at(32768)["method"] == footprint.at(4096)["method"]
        # the honest ratio at 4k: the slots a layer holds at most (budget + snapkv's decode window,
        # or + the decode step's token) over 4096 fp16 tokens; these caches hold no fixed bytes
        slots = budget + (config.snapkv_window if method.startswith("snapkv") else 1)
        assert footprint.at(4096)["ratio"] <= 1.03 * slots / 4096, (slots, figure)
        assert footprint.at(4096)["fp16"] == pytest.approx(4096 * figure["bytes_per_token"]["fp16"], rel=1e-6)
    else:
        assert figure["eviction_cap_tokens"] is None and figure["capped_bytes"] is None
        assert figure["bytes_per_token"]["method"] < figure["bytes_per_token"]["fp16"]


CONTINUED = [pytest.param(m, {}, id=m) for m in registry.names() if m != "fp16"]  # default budgets: 1024
CONTINUED += [pytest.param(m, fields, id=f"{m}-small") for m, fields in SMALL.items()]  # fresh prompts


@pytest.mark.parametrize(("method", "fields"), CONTINUED)
def test_the_probe_lengths_hold_what_fresh_prompts_hold(model: Any, method: str, fields: dict[str, Any]) -> None:
    """measure() runs one cache through both probe lengths while no budget is within reach, and an
    evicting one on past its budget: exact only if the bytes after a continuation equal those
    after a fresh prompt of that length."""
    config = KVCacheConfig(method=method, **fields)
    footprint = measure(model, config)
    lengths = footprint.probe_lengths
    fresh = [filled_bytes(model, make_caches(model, config), n)[-1] for n in lengths]
    assert [round(footprint.at(n)["method"]) for n in lengths] == fresh
    cap = footprint.cap_probe_tokens
    if cap is not None:  # a prompt past the budget and one generated step, fresh
        assert footprint.to_dict()["capped_bytes"] == filled_bytes(model, make_caches(model, config), cap, 1)[-1]


@pytest.mark.parametrize(("family", "synthetic"), [("smollm3", True), ("qwen2", True), ("mistral3", False)])
def test_probes_skip_the_weights_only_where_every_layer_holds_a_kvcache(family: str, synthetic: bool) -> None:
    """A wrapper of KVCache layers is probed on random keys; a model with sliding-window layers
    (rotating caches, whose bytes follow their own rules) runs its weights. Either way the probe
    holds what a real prompt leaves."""
    model = families.build(family)
    config = KVCacheConfig(method="affine")
    footprint = measure(model, config)
    assert footprint.synthetic is synthetic
    fresh = [filled_bytes(model, make_caches(model, config), n)[-1] for n in footprint.probe_lengths]
    assert [round(footprint.at(n)["method"]) for n in footprint.probe_lengths] == fresh
