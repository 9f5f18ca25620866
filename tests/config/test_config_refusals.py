"""A KV setting written for a method it does not apply to: the refusal lists every method that takes
it (hybrids included) and, for an eviction policy, the hybrid that keeps its tokens as codes that do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config_support import entry, only_issue, write_config
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, owners, settings

SEEDED = "affine, turboquant_mse, turboquant_prod, qjl, and the hybrids " + ", ".join(m.name for m in registry.HYBRIDS)


def test_seed_on_an_eviction_policy_names_the_hybrid_not_a_bit_count(tmp_path: Path) -> None:
    path = write_config(tmp_path, entry("model: ./model\nport: 8081\nmethod: snapkv\nseed: 7"), dedent=False)
    assert only_issue(path) == (
        7,
        11,
        "$.servers.coder.seed",
        f"seed does not apply to method snapkv (only to: {SEEDED}); "
        "to keep snapkv's tokens as affine codes use method snapkv_affine",
    )


def test_seed_on_a_quantizer_without_hybrids_lists_the_hybrids_but_suggests_none(tmp_path: Path) -> None:
    path = write_config(tmp_path, entry("model: ./model\nport: 8081\nmethod: kivi\nseed: 3"), dedent=False)
    assert only_issue(path)[3] == f"seed does not apply to method kivi (only to: {SEEDED})"


def test_bits_quotes_only_a_bit_width_the_hybrid_offers(tmp_path: Path) -> None:
    offered = write_config(tmp_path, entry("model: ./model\nport: 8081\nmethod: h2o\nbits: 4"), dedent=False)
    assert only_issue(offered)[3].endswith("; to keep h2o's tokens as 4-bit codes use method h2o_affine")
    other = tmp_path / "other"
    other.mkdir()
    refused = write_config(other, entry("model: ./model\nport: 8081\nmethod: h2o\nbits: 7"), dedent=False)
    message = only_issue(refused)[3]
    assert message.endswith("; to keep h2o's tokens as affine codes use method h2o_affine") and "7" not in message


# Every (eviction policy, setting) where the policy's hybrid takes the setting and the policy does not
# (bits, whose value is a bit width, has its own test above).
HYBRID_ONLY = [
    (policy.name, f.name)
    for policy in registry.METHODS
    if policy.family == "eviction"
    for f in settings()
    if f.name != "bits"
    and policy.name not in owners(f.name)
    and any(registry.parts(m)[0] == policy.name for m in owners(f.name))
]


def _written(name: str) -> str:
    """The setting as an entry writes it, with a value that would be valid for the hybrid."""
    f = next(f for f in settings() if f.name == name)
    value = {bool: "false", int: "3", str: "x"}[f.metadata["kind"]]
    if f.metadata["choices"]:
        value = str(f.metadata["choices"][-1]).lower()
    return f"{name}: {value}" if name in OWN_KEYS else f"overrides:\n  {name}: {value}"


@pytest.mark.parametrize(("method", "name"), HYBRID_ONLY, ids=[f"{m}-{n}" for m, n in HYBRID_ONLY])
def test_every_setting_refused_for_a_policy_suggests_its_hybrid(tmp_path: Path, method: str, name: str) -> None:
    text = entry(f"model: ./model\nport: 8081\nmethod: {method}\n{_written(name)}")
    path = write_config(tmp_path, text, dedent=False)
    message = only_issue(path)[3]
    assert message.startswith(f"{name} ")
    assert all(m in message for m in owners(name))  # every method that takes it, hybrids included
    assert message.endswith(f"; to keep {method}'s tokens as affine codes use method {method}_affine"), message


def test_the_policy_table_is_not_empty() -> None:
    """Guards the parametrized test above against passing by having no cases."""
    assert ("snapkv", "seed") in HYBRID_ONLY and ("h2o", "affine_group_size") in HYBRID_ONLY
