"""A KV setting `veloxd serve` refuses is named by the flag that holds it (--bits, --seed, or
`--set FIELD`), not by --method: the user sees which flag to change."""

from __future__ import annotations

import pytest

from tests.support import REPO, run_veloxd

MODEL = str(REPO / "veloxd" / "assets" / "tiny-llama")  # validation ends before any load


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--method", "kivi", "--bits", "3"], "--bits: bits=3 is not valid for method kivi; choose one of [2, 4]"),
        (
            ["--method", "turboquant_mse", "--bits", "9"],
            "--bits: bits=9 is not valid for method turboquant_mse; choose one of [2, 3, 4]",
        ),
        (["--method", "turboquant_mse", "--seed", "-1"], "--seed: seed=-1 for method turboquant_mse: must be >= 0"),
        (
            ["--method", "kivi", "--set", "kivi_group_size=48"],
            "--set kivi_group_size: kivi_group_size=48 for method kivi: choose one of [32, 64, 128]",
        ),
        (
            ["--method", "snapkv", "--set", "snapkv_window=9999999"],
            "--set snapkv_window: snapkv_window=9999999 for method snapkv: must be <= 4096",
        ),
        (  # a rule tying two fields names the one it reports, as the flag that sets it
            ["--method", "kivi", "--set", "kivi_group_size=64", "--set", "kivi_residual_length=100"],
            "--set kivi_residual_length: kivi_residual_length=100 for method kivi: "
            "must be a multiple of kivi_group_size=64",
        ),
    ],
)
def test_a_refused_kv_value_names_its_flag(flags: list[str], line: str) -> None:
    done = run_veloxd("serve", "--model", MODEL, "--port", "1", *flags)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"veloxd serve: error: {line}"
