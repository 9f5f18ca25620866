"""Every mlx_lm text family a Mac user would run, through every method: served within a bound, or
refused before load with the true reason (and by make_caches too, with the same reason).

The models are testkit.families' tiny random-weight ones (4 layers, GQA 2, head_dim 64, sliding
windows where the family has them); the cells are testkit.coverage's (a 64-token prompt, 8 decode
steps teacher-forced on the fp16 continuation, against mlx_lm's own caches).
"""

from __future__ import annotations

import pytest

from testkit import coverage, families
from veloxd.kv import KVCacheConfig, attention, make_caches, registry

# Why a family is refused, per method (None: served). One entry per family testkit builds.
REFUSED_FOR_ALL = {
    "gemma2": attention.SOFTCAP,
    "gpt_oss": attention.SINKS,
    "gemma3n": attention.KV_READ_BACK,
}
REFUSED_FOR_EVICTION = {"gemma4_text": attention.KV_SHARED}

# Bounds per method family on random weights: mean KL(fp16 || method) over the decode steps, and
# greedy agreement (testkit.coverage.compare). Quantizers at their default bits; eviction keeps 48
# of 64-72 tokens. Random weights give near-flat next-token distributions (top two often within
# 0.1-0.4 nat), so an eviction method's top-1 flips on small changes: KL is its bound, and greedy
# agreement is asserted for the quantizers only.
KL_BOUND = {"quantization": 0.12, "eviction": 0.08, "hybrid": 0.08}
AGREEMENT_BOUND = {"quantization": 0.5}
# Sharp attention (qk-norm: key and query norms 8 and 16, docs/models.md "Why gemma3_text and olmo2
# lose more"): every method loses more there; the bounds are the measured losses with margin.
SHARP = {"gemma3_text", "olmo2"}
SHARP_KL_BOUND = {"quantization": 0.5, "eviction": 0.3, "hybrid": 0.3}


def expected_refusal(family: str, method: str) -> str | None:
    if family in REFUSED_FOR_ALL:
        return REFUSED_FOR_ALL[family]
    if family in REFUSED_FOR_EVICTION and registry.get(method).evicts:
        return REFUSED_FOR_EVICTION[family]
    return None


def test_the_brief_families_are_all_built() -> None:
    wanted = {"llama", "qwen2", "qwen3", "ministral3", "mistral3", "smollm3", "phi3", "starcoder2", "olmo2"}
    wanted |= {"granite", "glm4", "cohere2", "internlm3", "exaone4", "qwen3_moe", "mixtral", "deepseek_v2"}
    wanted |= {"minicpm", "gemma3_text", "gemma2", "gpt_oss", "llama4_text", "gemma3n", "gemma4_text", "qwen3_next"}
    assert wanted <= set(families.families())
    assert set(REFUSED_FOR_ALL) | set(REFUSED_FOR_EVICTION) <= set(families.families())


@pytest.mark.parametrize("family", families.families())
def test_pre_load_verdicts_name_the_true_reason(family: str) -> None:
    for method in coverage.methods():
        reason = coverage.refusal(family, method)
        expected = expected_refusal(family, method)
        if expected is None:
            assert reason is None, f"{family} × {method} refused: {reason}"
        else:
            assert reason is not None and expected in reason, f"{family} × {method}: {reason}"
            assert f"model type '{families.config(family)['model_type']}'" in reason
            assert "Serve it with" in reason and "fp16" in reason


@pytest.mark.parametrize("family", sorted(REFUSED_FOR_ALL))
def test_make_caches_refuses_for_the_same_reason(family: str) -> None:
    model = families.build(family)
    with pytest.raises(ValueError, match=REFUSED_FOR_ALL[family].split(" (")[0].replace("(", r"\(")):
        make_caches(model, KVCacheConfig("affine"))
    make_caches(model, KVCacheConfig("fp16"))  # the baseline is never refused


def test_make_caches_refuses_eviction_on_kv_shared_layers() -> None:
    model = families.build("gemma4_text")
    with pytest.raises(ValueError, match="KV sharing"):
        make_caches(model, KVCacheConfig("snapkv"))


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in families.families() if f not in REFUSED_FOR_ALL])
def test_served_cells_agree_with_mlx_lms_own_caches(family: str) -> None:
    cells = coverage.family_cells(family)
    assert [c.method for c in cells] == coverage.methods()
    for cell in cells:
        if cell.refusal is not None:
            assert expected_refusal(family, cell.method) is not None, cell
            continue
        kind = registry.get(cell.method).family
        assert cell.kl <= (SHARP_KL_BOUND if family in SHARP else KL_BOUND)[kind], cell
        if kind in AGREEMENT_BOUND and family not in SHARP:
            assert cell.agreement >= AGREEMENT_BOUND[kind], cell


def test_models_page_table_matches_the_verdicts() -> None:
    page = coverage.DOC.read_text()
    assert coverage.BEGIN in page and coverage.END in page, "docs/models.md lost its coverage markers"
    expected = coverage.splice(page, coverage.table(coverage.verdicts()))
    assert page == expected, "docs/models.md's coverage table is stale: run python -m testkit.coverage --write"
