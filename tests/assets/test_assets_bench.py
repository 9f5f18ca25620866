"""Benchmark building blocks: the realistic-keys variant, the Pareto front, the data pieces."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from benchmarks.data import PassKey, TokenizedCorpus, TrainingStream, is_held_out
from benchmarks.kv.pareto import front
from tests.support import run_python

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def test_outlier_variant_keeps_logits_and_makes_keys_heavy_tailed(tiny_model: Path) -> None:
    import mlx.core as mx

    from benchmarks.model import key_channel_stats, load, max_logit_difference, with_outlier_keys

    base = load(tiny_model)
    variant = with_outlier_keys(base, scale=20.0)
    tokens = mx.array([list(range(10, 200))])  # (1, 190)
    scale = float(mx.abs(base.model(tokens)).max())
    assert max_logit_difference(base.model, variant.model, tokens) < 1e-4 * max(1.0, scale)
    assert (
        key_channel_stats(variant.model, tokens)["max_over_median"]
        > 5 * key_channel_stats(base.model, tokens)["max_over_median"]
    )
    # The change is real: the k_proj weights differ.
    assert (
        float(
            mx.abs(base.model.layers[0].self_attn.k_proj.weight - variant.model.layers[0].self_attn.k_proj.weight).max()
        )
        > 0
    )


def test_pareto_front_drops_dominated_points() -> None:
    rows: list[dict[str, Any]] = [
        {"label": "a", "stored_vs_fp16": 0.25, "kl_mean": 0.01},
        {"label": "b", "stored_vs_fp16": 0.30, "kl_mean": 0.02},  # dominated by a
        {"label": "c", "stored_vs_fp16": 0.12, "kl_mean": 0.08},
        {"label": "d", "stored_vs_fp16": 1.00, "kl_mean": 0.0},
        {"label": "e", "stored_vs_fp16": None, "kl_mean": 0.0},  # no figure: ignored
    ]
    assert front(rows) == ["c", "a", "d"]


def test_held_out_split_is_deterministic_and_small() -> None:
    names = [f"pkg/module_{i}.py" for i in range(2000)]
    held = [n for n in names if is_held_out(n)]
    # Deterministic across processes: a fresh interpreter with another hash seed picks the same files.
    code = (
        "from benchmarks.data import is_held_out; names = [f'pkg/module_{i}.py' for i in range(2000)]; "
        "print('\\n'.join(n for n in names if is_held_out(n)))"
    )
    other = run_python(code, PYTHONHASHSEED="12345")
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == held
    assert 0.01 < len(held) / len(names) < 0.06


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


def test_passkey_prompt_places_the_key_at_the_depth_and_ends_with_the_question(tokenizer: Tokenizer) -> None:
    passkey = PassKey(tokenizer)
    filler = np.arange(10, 1010, dtype=np.int32) % 400 + 10
    prompt, answer = passkey.prompt("73914", filler, 600, 0.5)
    assert len(prompt) == 600
    assert tokenizer.decode(prompt[-len(passkey.question) :].tolist()).endswith("The pass key is")
    assert tokenizer.decode(answer.tolist()).strip() == "73914."
    intro = passkey.intro("73914")
    starts = [i for i in range(len(prompt) - len(intro)) if (prompt[i : i + len(intro)] == intro).all()]
    assert len(starts) == 1 and abs(starts[0] - 300) < 40


def test_training_stream_is_seeded_and_masks_only_random_first_copies(tokenizer: Tokenizer) -> None:
    docs = TokenizedCorpus(["a", "b"], [np.arange(50, 450, dtype=np.int32), np.arange(60, 900, dtype=np.int32)])
    one = TrainingStream(docs, PassKey(tokenizer), 512, seed=3).batch(8, 256)
    two = TrainingStream(docs, PassKey(tokenizer), 512, seed=3).batch(8, 256)
    assert (one[0] == two[0]).all() and (one[1] == two[1]).all()
    tokens, mask = one
    assert tokens.shape == (8, 257) and mask.shape == (8, 256)
    assert 0.5 < mask.mean() <= 1.0


def test_kv_benchmark_pipeline_measures_writes_and_renders(tiny_model: Path, tmp_path: Path) -> None:
    import json

    from benchmarks.docs import plots, readme_section, report
    from benchmarks.kv import quality as kv

    out = tmp_path / "kv.json"
    arms = "fp16,mlx-q4,affine-4,streaming_llm-40"
    assert (
        kv.main(
            [
                "--model",
                str(tiny_model),
                "--contexts",
                "160",
                "--decode",
                "4",
                "--arms",
                arms,
                "--no-passkey",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    rows = {(r["variant"], r["label"]): r for r in result["rows"]}
    assert result["variant_check"]["max_abs_logit_diff"] < 1e-3
    fp16 = rows[("tiny-llama", "fp16")]
    assert fp16["kl_mean"] == 0.0 and fp16["top1_agreement"] == 1.0 and fp16["stored_vs_fp16"] == 1.0
    # Stored bytes are the tokens held: 164 tokens sit in a 256-row fp16 buffer, and the slack must
    # not count (it made every ratio over fp16 look up to 256 / tokens smaller).
    config = json.loads((tiny_model / "config.json").read_text())
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    fp16_bytes_per_token = config["num_hidden_layers"] * kv_heads * head_dim * 2 * 2  # keys and values
    assert fp16["stored_bytes_per_token"] == fp16_bytes_per_token
    # mlx_lm 4-bit, group 64: 4 bits + a 16-bit scale and bias per 64 elements = 4.5 / 16 of fp16.
    assert abs(rows[("tiny-llama", "mlx-q4")]["stored_vs_fp16"] - 4.5 / 16) < 0.01
    assert rows[("tiny-llama", "mlx-q4")]["positions"] == 4
    for variant in ("tiny-llama", "tiny-llama+outliers"):
        for label in ("mlx-q4", "affine-4"):
            row = rows[(variant, label)]
            assert "error" not in row, row.get("error")
            # affine-4's codes plus its 32 exact tokens: 32 / 164 of fp16 at this short length
            assert 0.0 < row["kl_mean"] < 1.0 and row["stored_vs_fp16"] < 0.5
            assert 0.8 < row["resident_over_nbytes"] < 1.3
    evicted = rows[("tiny-llama", "streaming_llm-40")]
    assert "error" not in evicted, evicted.get("error")
    assert evicted["stored_vs_fp16"] < 0.5
    pngs = plots.render(result, tmp_path)
    assert pngs and all(p.stat().st_size > 10_000 for p in pngs)
    text = report.kv_section(result)
    assert "| `affine-4` |" in text and "Pareto front" in text
    assert "# Results" in readme_section.render(result, contexts=(160,))


def test_every_planned_label_is_an_arm_and_hybrids_are_arms() -> None:
    """The full plan names arms by label; a renamed or missing arm would silently drop from the run."""
    from benchmarks.kv import arms
    from benchmarks.kv import quality as kv
    from veloxd.kv import registry

    plan = kv.Plan.full()
    for context, labels in plan.subsets.items():
        have = {a.label for a in arms.all_arms(context)}
        assert set(labels) <= have, set(labels) - have
    at_1k = {a.label: a for a in arms.all_arms(1024)}
    for info in registry.HYBRIDS:
        arm = at_1k[f"{info.name}-4-256"]
        config = arm.config()
        assert arm.family == "hybrid" and config is not None and config.method == info.name


def test_speed_benchmark_written_caches_hold_the_context_and_decode() -> None:
    """The speed benchmark writes quantizer caches directly (no attention over the prompt): every
    layer then holds exactly the context, a recent window is back at its size, and a decode step
    runs over them (as over caches a prefill filled)."""
    import mlx.core as mx

    from benchmarks.kv import speed_model

    model = speed_model.build_model()
    arms = {a.label: a for a in speed_model.arms()}
    context = speed_model.PREFILL_CHUNK + 300  # a full chunk and a partial one
    token = speed_model.tokens(1)
    for label in ("fp16", "mlx-q4", "affine-4", "turboquant_mse-3", "qjl"):
        caches = speed_model.filled(model, arms[label], context)
        assert [c.offset for c in caches] == [context] * len(caches), label
        for cache in caches:
            window = getattr(cache, "window", None)
            if window is not None:
                assert window.arrays()[0].shape[2] <= 2 * cache.config.recent_window, label
        logits = model(token, cache=caches)
        mx.eval(logits)
        assert logits.shape == (1, 1, speed_model.VOCAB) and bool(mx.isfinite(logits).all()), label
        assert [c.offset for c in caches] == [context + 1] * len(caches), label


def test_kernel_rates_cover_every_read_form_and_render_against_dense() -> None:
    """`make bench-kernels` measures every read form (dense, quantized_matmul at 1-8 bits both ways,
    dequantize and veloxd's shifts for the widths it unpacks, Lloyd-Max, the one-row and channel-major key reads) and renders each scores/weighted rate relative to the dense read."""
    from benchmarks.kv import kernels

    rates = kernels.measure(1024)
    for bits in (1, 2, 3, 4, 6, 8):
        assert {f"{bits}-bit quantized_matmul scores", f"{bits}-bit quantized_matmul weighted"} <= set(rates)
    assert {"2-bit dequantize", "3-bit dequantize", "4-bit dequantize", "6-bit dequantize"} <= set(rates)
    assert {"1-bit ops.dequant", "3-bit ops.dequant", "6-bit ops.dequant"} <= set(rates)
    assert {"3-bit Lloyd-Max decode + dense scores", "4-bit Lloyd-Max decode + dense weighted"} <= set(rates)
    assert {"4-bit quantized_matmul scores, 1 query row", "4-bit channel-major codes scores"} <= set(rates)
    assert all(ns > 0 for ns in rates.values()), rates
    table = kernels.render(rates, 1024)
    dense = rates["dense scores"]
    assert f"| 4-bit quantized_matmul scores | {rates['4-bit quantized_matmul scores']:.2f} | " in table
    assert f"{rates['4-bit quantized_matmul scores'] / dense:.1f} |" in table
    assert f"| 3-bit dequantize | {rates['3-bit dequantize']:.2f} |  |" in table


def test_speed_benchmark_prefill_only_run_writes_no_decode_context(tmp_path: Path) -> None:
    """`--no-decode` measures prefill alone (the arms asked for, fp16 and mlx-q4 beside them), after
    `--prefill-prompt` cached tokens (64 here: without OpenBLAS 1,024 cost ~35 s per arm)."""
    import json

    out = tmp_path / "speed.json"
    args = "['--no-decode', '--prefill-rounds', '1', '--prefill-prompt', '64', '--arms', 'kivi-4', '--out', "
    result = run_python(f"from benchmarks.kv.speed import main\nmain({args}{str(out)!r}])\n", timeout=900)
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert written["decode_ms"] == {} and written["prefill_prompt"] == 64 and written["prefill_rounds"] == 1
    assert "prefill after 64 tokens: median of 1 interleaved rounds" in result.stdout
    assert set(written["prefill_ms"]) == {"fp16", "mlx-q4", "kivi-4"}
    assert all(ms > 0 for ms in written["prefill_ms"].values())
    assert "| kivi-4 |" in result.stdout
    refused = run_python("from benchmarks.kv.speed import main\nmain(['--no-decode', '--no-prefill'])\n")
    assert refused.returncode == 2 and "measures nothing" in refused.stderr


def test_half_precision_benchmark_times_each_cache_against_fp16_on_the_shipped_model() -> None:
    """`python -m benchmarks.kv.half`: the shipped float16 model as it ships, fp16 beside the
    methods asked for, one line each with its median and its speed ÷ fp16."""
    import re

    result = run_python(
        "from benchmarks.kv.half import main\nmain(['--steps', '2', '--rounds', '1', '--methods', 'affine'])\n"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tiny-llama (llama, float16 weights), ") and "LD_PRELOAD=" in lines[0]
    rows = [re.match(r"(\S+)\s+([\d.]+) ms  speed ÷ fp16\s+([\d.]+)$", line) for line in lines[1:]]
    assert [m[1] for m in rows if m] == ["fp16", "affine"], lines
    assert all(m and float(m[2]) > 0 for m in rows) and rows[0] and rows[0][3] == "1.00"
