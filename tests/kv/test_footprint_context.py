"""READY's memory figure reads the context length by the worker's and the daemon's rule
(veloxd.model_config): a wrapper model's text_config included."""

from __future__ import annotations

from mlx_lm.models import gemma3

from veloxd.kv.footprint import max_context
from veloxd.serve.limits import context_length

TEXT = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 2048,
}


def test_a_wrapper_models_context_is_read_from_its_text_config() -> None:
    """gemma3 (mlx_lm's own model) keeps its text model's settings in text_config."""
    model = gemma3.Model(gemma3.ModelArgs.from_dict({"model_type": "gemma3", "vocab_size": 128, "text_config": TEXT}))
    assert max_context(model) == 2048
    assert context_length(model.args) == 2048  # the worker's limit: the same figure
