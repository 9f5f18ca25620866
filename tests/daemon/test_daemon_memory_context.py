"""The context length the memory admission bills is the one the worker accepts (veloxd.model_config).

Real config.json files in model directories: a wrapper model's context under text_config, a model
stating it as max_seq_len, and one stating none (billed the documented 4096 tokens; the worker
then falls back to its tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from veloxd.daemon.memory import context_tokens
from veloxd.serve.limits import context_length

CASES = [
    pytest.param({"model_type": "gemma3", "text_config": {"max_position_embeddings": 32768}}, 32768, id="text_config"),
    pytest.param({"model_type": "mpt", "max_seq_len": 2048}, 2048, id="max_seq_len"),
    pytest.param({"max_position_embeddings": 8192, "max_seq_len": 2048}, 8192, id="first-key-wins"),
    pytest.param({"model_type": "llama"}, None, id="none-stated"),
]


def model_dir(root: Path, config: dict[str, Any]) -> Path:
    directory = root / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(("config", "stated"), CASES)
def test_admission_bills_the_context_the_worker_accepts(
    tmp_path: Path, config: dict[str, Any], stated: int | None
) -> None:
    directory = model_dir(tmp_path, config)
    parsed = json.loads((directory / "config.json").read_text())
    assert context_length(parsed) == stated  # the worker's limit, before any tokenizer fallback
    assert context_tokens(str(directory)) == (4096 if stated is None else stated)


def test_a_config_that_is_not_an_object_is_billed_the_default(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("[1, 2]")
    assert context_tokens(str(directory)) == 4096
