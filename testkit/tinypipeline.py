"""A tiny qwen2-architecture model with a sharded-checkpoint index: what mlx_lm's pipeline loading needs.

mlx_lm 0.32 splits layers across ranks only for model types with pipeline support (qwen2 is one,
llama is not), and loads each rank's layers through `model.safetensors.index.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from testkit.tinymodel import model_config, write_tokenizer


def write_tiny_pipeline_model(
    path: str | Path, *, vocab_size: int = 512, layers: int = 4, hidden: int = 128, seed: int = 0
) -> Path:
    """Create the model directory at `path` (idempotent)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    path = Path(path)
    if (path / "model.safetensors.index.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(path, vocab_size)
    # The tiny llama's shape as qwen2, whose head size follows from hidden / heads (no head_dim key).
    config = {
        **model_config(vocab_size, layers, hidden),
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "rms_norm_eps": 1e-6,
    }
    del config["head_dim"]
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    weights = {k: (v * 2.0 if k.endswith("embed_tokens.weight") else v) for k, v in weights.items()}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(sorted(weights), "model.safetensors")}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
