"""Tiny random-weight models of every mlx_lm text family a Mac user would run, from their own ModelArgs.

Each family is a config.json-shaped dict (`config(family)`): the same dict feeds the pre-load
check (veloxd.kv.preflight) and builds the model the way mlx_lm's load does (its Model class on
its ModelArgs). Shapes are kept small and alike: 4 layers, 4 query heads over 2 KV heads
(GQA 2), head_dim 64, a 256-token vocabulary, and sliding windows of 16 tokens on the layers
where the family has them, so a 64-token prompt reaches past every window.
`write_model_dir` writes one as a model directory `veloxd serve` can load (with testkit's tokenizer).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB, WINDOW = 4, 4, 2, 64, 256, 16
HIDDEN = HEADS * HEAD_DIM  # 256: families that derive head_dim from hidden_size get 64 too

_BASE: dict[str, Any] = {
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "intermediate_size": 256,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
_SLIDING = ["sliding_attention", "full_attention"] * (LAYERS // 2)
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128}

# Per family: what differs from _BASE (each family's own required ModelArgs fields).
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"layer_types": _SLIDING, "sliding_window": WINDOW},
    "qwen2": {},
    "qwen3": {},
    "ministral3": {
        "layer_types": _SLIDING,
        "sliding_window": WINDOW,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 4096,
        },
    },
    "mistral3": {},  # built below: a ministral3 text_config with sliding layers
    "smollm3": {"no_rope_layer_interval": 4},
    "phi3": {},
    "starcoder2": {"norm_epsilon": 1e-5},
    "olmo2": {},
    "granite": {
        "logits_scaling": 1.0,
        "attention_multiplier": HEAD_DIM**-0.5,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "glm4": {"attention_bias": False, "partial_rotary_factor": 0.5},
    "cohere2": {"layer_norm_eps": 1e-5, "sliding_window": WINDOW, "sliding_window_pattern": 2},
    "internlm3": {},
    "exaone4": {"rope_scaling": None, "sliding_window": WINDOW, "sliding_window_pattern": "LG"},
    "qwen3_moe": {**_MOE, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "deepseek_v2": {
        "moe_intermediate_size": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 64,
        "q_lora_rank": None,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 32,
        "v_head_dim": HEAD_DIM,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "rope_scaling": {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096},
    },
    "minicpm": {"dim_model_base": HIDDEN, "scale_depth": 1.4, "scale_emb": 1.0},
    "gemma3_text": {"query_pre_attn_scalar": HEAD_DIM, "sliding_window": WINDOW, "sliding_window_pattern": 2},
    "gemma2": {"query_pre_attn_scalar": HEAD_DIM},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": _SLIDING, "sliding_window": WINDOW},
    "llama4_text": {"intermediate_size_mlp": 256, "no_rope_layers": [1, 1, 1, 0], "use_qk_norm": True},
    "gemma4_text": {
        "global_head_dim": HEAD_DIM,
        "num_global_key_value_heads": KV_HEADS,
        "num_kv_shared_layers": 2,  # the last two layers read the KV of earlier ones, as in Gemma 4
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 16,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "use_double_wide_mlp": False,
    },
    "qwen3_next": {
        **_MOE,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 128,
        "mlp_only_layers": [],
        "partial_rotary_factor": 0.25,
        "full_attention_interval": 2,
    },
}


_GEMMA3N_TEXT: dict[str, Any] = {
    "num_kv_shared_layers": 2,  # the last two layers read the KV of earlier ones, as in Gemma 3n
    "vocab_size_per_layer_input": VOCAB,
    "sliding_window": WINDOW,
    "rope_local_base_freq": 10000.0,
    "final_logit_softcapping": 30.0,
    "layer_types": _SLIDING,
    "activation_sparsity_pattern": [0.0] * LAYERS,
    "hidden_size_per_layer_input": 16,
    "altup_num_inputs": 2,
    "altup_coef_clip": 120.0,
    "altup_correct_scale": True,
    "altup_active_idx": 0,
    "laurel_rank": 16,
}


def families() -> list[str]:
    return [*_FAMILIES, "gemma3n"]


def config(family: str, vocab: int = VOCAB) -> dict[str, Any]:
    """The family's tiny config.json (a fresh dict)."""
    sizes = {"vocab_size": vocab}
    if family == "gemma3n":
        text = {**_BASE, **_GEMMA3N_TEXT, "model_type": "gemma3n_text", "vocab_size_per_layer_input": vocab, **sizes}
        return {"model_type": "gemma3n", "text_config": copy.deepcopy(text)}
    if family == "mistral3":
        text = {**config("ministral3", vocab), "tie_word_embeddings": True}
        return {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": text}
    return copy.deepcopy({"model_type": family, **_BASE, **_FAMILIES[family], **sizes})


def build(family: str, seed: int = 0, vocab: int = VOCAB) -> Any:
    """The family's model with random weights (evaluated), as mlx_lm's load would build it."""
    import mlx.core as mx

    from veloxd.serve.mlx_compat.models import model_classes

    cfg = config(family, vocab)
    model_class, args_class_ = model_classes(cfg)
    args_class: Any = args_class_  # an mlx_lm ModelArgs dataclass (BaseModelArgs.from_dict)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(cfg))
    mx.eval(model.parameters())
    return model


def write_model_dir(family: str, path: str | Path, seed: int = 0, vocab: int = 512) -> Path:
    """A model directory (config.json, model.safetensors, tokenizer) `veloxd serve` can load.

    The vocabulary is testkit's byte-level BPE, larger than 256 (its alphabet alone is).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from testkit.tinymodel import write_tokenizer

    path = Path(path)
    write_tokenizer(path, vocab)
    weights = dict(tree_flatten(build(family, seed, vocab).parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = {**config(family, vocab), "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path
