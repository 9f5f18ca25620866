"""The outlier-key variant of the KV benchmark at every head dimension real models use."""

from __future__ import annotations

import pytest

from benchmarks.model import OUTLIER_PAIRS, outlier_pairs, outlier_rows


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_outlier_pairs_stay_inside_each_head(head_dim: int) -> None:
    pairs = outlier_pairs(head_dim)
    assert len(set(pairs)) == len(OUTLIER_PAIRS) and all(0 <= i < head_dim // 2 for i in pairs)
    rows = outlier_rows(head_dim, 3, pairs)
    assert len(rows) == 3 * 2 * len(pairs) and max(rows) < 3 * head_dim


def test_head_dim_128_keeps_its_pairs_and_a_pair_past_the_head_is_refused() -> None:
    assert outlier_pairs(128) == OUTLIER_PAIRS
    with pytest.raises(ValueError, match=r"\[0, 32\) for head_dim 64"):
        outlier_rows(64, 3, OUTLIER_PAIRS)  # 40 and 58 would write into the next head, or past the weight
