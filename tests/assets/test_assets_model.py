"""The shipped tiny model: loads with mlx_lm, generates, has GQA and a chat template, fits 10 MB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ASSET = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"
MAX_BYTES = 10 * 1024 * 1024


@pytest.mark.parametrize("shipped", ["tiny-llama", "tiny-llama-retrieval"])
def test_weights_are_fp16_and_within_size_bound(shipped: str) -> None:
    """Both shipped models (this one and tests/assets/test_assets_retrieval_model.py's)."""
    import mlx.core as mx

    weights_file = ASSET.parent / shipped / "model.safetensors"
    assert weights_file.stat().st_size <= MAX_BYTES
    weights = mx.load(str(weights_file))
    assert isinstance(weights, dict)  # a safetensors file loads as {name: array}
    assert {w.dtype for w in weights.values()} == {mx.float16}


def test_config_is_llama_with_gqa_and_head_dim_128() -> None:
    config = json.loads((ASSET / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["head_dim"] == 128
    assert 2048 <= config["vocab_size"] <= 4096


def test_loads_generates_and_applies_the_chat_template() -> None:
    from mlx_lm import generate, load

    model, tokenizer = load(str(ASSET))[:2]  # (model, tokenizer): the config comes only with return_config
    messages = [{"role": "user", "content": "What is the pass key?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|user|>What is the pass key?</s><|assistant|>"
    text = generate(model, tokenizer, prompt="def main(argv):\n    ", max_tokens=12)
    assert len(tokenizer.encode(text)) >= 3  # a trained model writes code here, not an immediate EOS


def test_model_card_states_held_out_loss_below_unigram() -> None:
    card = ASSET / "MODEL_CARD.md"
    evaluation = json.loads((ASSET / "model_eval.json").read_text())
    assert card.exists() and "held-out NLL" in card.read_text()
    assert evaluation["held_out_nll"] < evaluation["unigram_nll"] - 0.5
