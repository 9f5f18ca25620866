"""testkit/pretrained.py: SmolLM2-135M-Instruct converted from its GGUF into an mlx_lm directory.

The q/k un-permutation is checked against the GGUF's own layout: its q/k rows as llama.cpp stores
them, run with interleaved ("traditional") RoPE as llama.cpp runs them, must give the same logits
as the converted directory with mlx_lm's rotate-half RoPE. Plus the tokenizer's digit split, the chat
template and the config a real model has (head_dim 64, GQA 3)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from testkit import pretrained


def llama_cpp_permute(w: mx.array, n_heads: int) -> mx.array:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows to interleaved pairs."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


@pytest.mark.parametrize(("n_heads", "head_dim"), [(1, 64), (3, 64), (9, 64), (4, 128), (2, 96), (2, 80)])
def test_unpermute_inverts_llama_cpp_permute(n_heads: int, head_dim: int) -> None:
    w = mx.random.normal((n_heads * head_dim, 24))
    once = llama_cpp_permute(w, n_heads)
    assert not mx.array_equal(once, w)
    assert mx.array_equal(pretrained.unpermute(once, n_heads), w)


def test_config_is_a_real_small_model(smollm2: Path) -> None:
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and config["head_dim"] == 64
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]) == (9, 3, 30)
    assert json.loads((smollm2 / "source.json").read_text())["license"] == "Apache-2.0"


@pytest.mark.slow
def test_converted_layout_matches_the_gguf_layout(smollm2: Path, tmp_path: Path) -> None:
    from mlx_lm import load

    gguf, _ = pretrained.gguf_source()
    loaded = mx.load(str(gguf), return_metadata=True)
    assert isinstance(loaded, tuple)
    raw, _ = loaded
    config = json.loads((smollm2 / "config.json").read_text())
    gguf_layout = tmp_path / "gguf-layout"  # llama.cpp's rows, run as llama.cpp runs them
    gguf_layout.mkdir()
    weights = pretrained.weights_from(raw, config, hf_layout=False)
    mx.save_safetensors(str(gguf_layout / "model.safetensors"), weights)
    (gguf_layout / "config.json").write_text(json.dumps({**config, "rope_traditional": True}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (gguf_layout / name).write_bytes((smollm2 / name).read_bytes())

    model, tokenizer = load(str(smollm2))[:2]  # (model, tokenizer): the config comes only with return_config
    tokens = mx.array(tokenizer.encode("The quick brown fox jumps over the lazy dog"))[None]  # [1, L]
    ours = np.array(model(tokens))
    del model
    theirs_model = load(str(gguf_layout))[0]
    theirs = np.array(theirs_model(tokens))
    assert np.abs(ours - theirs).max() < 1e-3 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_tokenizer_splits_digits_and_applies_the_chat_template(smollm2: Path) -> None:
    from mlx_lm import load

    tokenizer = load(str(smollm2), lazy=True)[1]
    pieces = [tokenizer.decode([t]) for t in tokenizer.encode("in 2024 we")]
    assert pieces == ["in", " ", "2", "0", "2", "4", " we"]  # llama.cpp's "smollm" pre-tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_bench_table_puts_the_shipped_models_kl_beside(tmp_path: Path) -> None:
    from benchmarks.kv.pretrained import NAME, markdown, shipped_kl

    kv_rows = [
        {"variant": "tiny-llama", "context": 1024, "label": "affine-4", "kl_mean": 0.0123},
        {"variant": "tiny-llama+outliers", "context": 1024, "label": "affine-4", "kl_mean": 0.0456},
        {"variant": "tiny-llama", "context": 4096, "label": "affine-4", "kl_mean": 0.9},
    ]
    (tmp_path / "kv.json").write_text(json.dumps({"rows": kv_rows}))
    ours = {"context": 1024, "label": "affine-4", "kl_mean": 0.0789, "top1_agreement": 0.97, "stored_vs_fp16": 0.31}
    failed = {"context": 1024, "label": "qjl-4", "error": "ValueError: no"}
    passkey = {"context": 1024, "label": "fp16", "by_depth": {"0.1": 1.0, "0.9": 0.5}, "accuracy": 0.75, "trials": 4}
    report = {"source": "src", "rows": [ours, failed], "passkey": [passkey]}
    text = markdown(report, shipped_kl(tmp_path / "kv.json"))
    assert f"| method | {NAME} KL | top-1 | stored x fp16 | tiny-llama KL | tiny-llama+outliers KL |" in text
    assert "| `affine-4` | 0.0789 | 0.970 | 0.310 | 0.0123 | 0.0456 |" in text
    assert "| `qjl-4` | failed: ValueError: no |" in text
    assert "| `fp16` | 100% | 50% | 75% (4) |" in text
    assert shipped_kl(tmp_path / "absent.json") == {}
