"""KVCacheConfig's rules beyond the schema (a multiple of 32, odd, below another setting) each report on
their own: a wrong setting, or a wrong key elsewhere in the entry, hides no other mistake; only a rule
reading a setting that is itself wrong stays silent (its verdict would rest on a value not written)."""

from __future__ import annotations

from pathlib import Path

from tests.config_support import entry, issues, write_config


def _issues(tmp_path: Path, body: str) -> list[tuple[str, str]]:
    return [(path, message) for _, _, path, message in issues(write_config(tmp_path, entry(body), dedent=False))]


def test_a_field_rule_still_reports_next_to_a_refused_setting(tmp_path: Path) -> None:
    found = _issues(
        tmp_path,
        "model: ./model\nport: 8081\nmethod: turboquant_mse\n"
        "overrides: {turboquant_outlier_channels: 33, turboquant_key_bits: 5}",
    )
    assert found == [
        (
            "$.servers.coder.overrides.turboquant_outlier_channels",
            "turboquant_outlier_channels=33 for method turboquant_mse: must be a multiple of 32",
        ),
        (
            "$.servers.coder.overrides.turboquant_key_bits",
            "turboquant_key_bits=5 for method turboquant_mse: choose one of [2, 3, 4]",
        ),
    ]


def test_two_broken_rules_of_one_entry_are_both_reported(tmp_path: Path) -> None:
    found = _issues(
        tmp_path,
        "model: ./model\nport: 8081\nmethod: snapkv\noverrides: {snapkv_budget: 10, snapkv_window: 20, snapkv_kernel: 4}",
    )
    assert found == [
        (
            "$.servers.coder.overrides.snapkv_window",
            "snapkv_window=20 for method snapkv: must not exceed snapkv_budget=10",
        ),
        ("$.servers.coder.overrides.snapkv_kernel", "snapkv_kernel=4 for method snapkv: must be odd"),
    ]


def test_a_cross_field_rule_runs_although_another_key_of_the_entry_is_wrong(tmp_path: Path) -> None:
    found = _issues(
        tmp_path,
        "model: ./model\nport: 0\nmethod: kivi\noverrides: {kivi_group_size: 64, kivi_residual_length: 100}",
    )
    assert found == [
        ("$.servers.coder.port", "port=0: must be >= 1"),
        (
            "$.servers.coder.overrides.kivi_residual_length",
            "kivi_residual_length=100 for method kivi: must be a multiple of kivi_group_size=64",
        ),
    ]


def test_a_cross_field_rule_with_a_refused_input_stays_silent(tmp_path: Path) -> None:
    """kivi_group_size=48 is refused; judging 100 against the default group size instead would blame
    kivi_residual_length for a kivi_group_size=32 the file never wrote."""
    found = _issues(
        tmp_path,
        "model: ./model\nport: 8081\nmethod: kivi\noverrides: {kivi_group_size: 48, kivi_residual_length: 100}",
    )
    assert found == [
        (
            "$.servers.coder.overrides.kivi_group_size",
            "kivi_group_size=48 for method kivi: choose one of [32, 64, 128]",
        ),
    ]


def test_a_rule_on_a_hybrid_reports_next_to_a_refused_bits(tmp_path: Path) -> None:
    found = _issues(
        tmp_path,
        "model: ./model\nport: 8081\nmethod: knorm_affine\nbits: 5\noverrides: {knorm_budget: 8, knorm_window: 8}",
    )
    assert found == [
        ("$.servers.coder.bits", "bits=5 is not valid for method knorm_affine; choose one of [2, 3, 4, 6, 8]"),
        (
            "$.servers.coder.overrides.knorm_window",
            "knorm_window=8 for method knorm_affine: must be below knorm_budget=8",
        ),
    ]
