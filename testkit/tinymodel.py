"""Write a tiny llama-architecture model (random weights, real BPE tokenizer) to a directory.

Used by the tests and by `make run` when no trained model is shipped: no download, a few
seconds on a CPU. GQA (4 query heads, 2 KV heads) and head_dim 128, like real models, so
every group size and rotation in veloxd applies.
"""

from __future__ import annotations

import json
import pydoc_data.topics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus() -> list[str]:
    """English text that every CPython install ships (the pydoc topic pages)."""
    return [text for text in pydoc_data.topics.topics.values() if text.strip()]


def write_tokenizer(path: Path, vocab_size: int, texts: Iterable[str] | None = None) -> Any:
    """Train a byte-level BPE (veloxd's special tokens, chat template) on `texts`; write its files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus() if texts is None else texts, trainer=trainer)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 8192,
            },
            indent=2,
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    return tokenizer


def model_config(vocab_size: int, layers: int, hidden: int) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def write_tiny_model(
    path: str | Path, *, vocab_size: int = 512, layers: int = 2, hidden: int = 128, seed: int = 0
) -> Path:
    """Create the model directory at `path` (idempotent: an existing complete model is kept)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    path = Path(path)
    if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(path, vocab_size)
    config = model_config(vocab_size, layers, hidden)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    # Keep logits well spread so greedy decoding is stable across caches.
    weights = {k: (v * 2.0 if k.endswith("embed_tokens.weight") else v) for k, v in weights.items()}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


if __name__ == "__main__":
    import sys

    print(write_tiny_model(sys.argv[1] if len(sys.argv) > 1 else ".cache/tiny-llama"))
