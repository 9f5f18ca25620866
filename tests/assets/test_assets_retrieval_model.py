"""The shipped retrieval model: loads with mlx_lm, is what its card says, retrieves (its weights'
dtype and size: tests/assets/test_assets_model.py)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

ASSETS = Path(__file__).resolve().parents[2] / "veloxd" / "assets"
MODEL = ASSETS / "tiny-llama-retrieval"


def test_loads_with_mlx_lm_with_the_heads_its_card_states() -> None:
    from mlx_lm import load

    config = json.loads((MODEL / "config.json").read_text())
    card = (MODEL / "MODEL_CARD.md").read_text()
    assert f"head_dim {config['head_dim']}" in card
    assert f"{config['num_key_value_heads']} KV heads, head_dim {config['head_dim']}" in card.replace("\n", " ")
    model, tokenizer = load(str(MODEL))[:2]  # (model, tokenizer): the config comes only with return_config
    attention = model.layers[0].self_attn
    assert len(model.layers) == config["num_hidden_layers"]
    assert (attention.n_heads, attention.n_kv_heads, attention.head_dim) == (4, 2, 64)  # GQA, a second head dim
    assert tokenizer.encode("def main():") == _tiny_llama_tokenizer().encode("def main():")


def _tiny_llama_tokenizer() -> TokenizerWrapper:
    from mlx_lm import load

    return load(str(ASSETS / "tiny-llama"))[1]


def test_training_record_is_reproducible_from_its_commands() -> None:
    from benchmarks.training.retrieval_eval import stage_records

    training = json.loads((MODEL / "training.json").read_text())
    stages = stage_records(training)
    assert stages[0]["init"] == "scratch" and len(stages) == 6  # as `make train-retrieval` runs them
    for stage in stages:
        assert stage["command"].startswith("python -m benchmarks.training.train_retrieval")
        assert stage["history"][-1]["step"] == stage.get("stopped_at", stage["steps"])
        # hard_keys came with stage 5 (an earlier stage's record has no such key)
        assert {"passkey", "recall", "copy", "code", "max_recalls"} <= set(stage["data_mix"])
        assert set(stage["data_mix"]) <= {"passkey", "recall", "copy", "code", "max_recalls", "hard_keys"}
        assert not stage["resumed"]
    assert training["curriculum"][-1][1] == 4096  # the last phase trains real 4096-token sequences
    assert [r for r in training["history"] if "loss" in r][-1]["context"] == 4096
    assert [stage["command"] for stage in stages] == makefile_commands()


def makefile_commands() -> list[str]:
    """The train_retrieval commands of `make train-retrieval`, with the Makefile's variables expanded."""
    text = (ASSETS.parents[1] / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^(RETRIEVAL_\w+) := (.*)$", text, re.MULTILINE))
    commands = re.findall(r"\$\(PY\) (-m benchmarks\.training\.train_retrieval .*)$", text, re.MULTILINE)
    expand = functools.partial(re.sub, r"\$\((RETRIEVAL_\w+)\)", lambda m: variables[m.group(1)].strip())
    return ["python " + " ".join(expand(c).split()) for c in commands]


@pytest.mark.parametrize("context", ["1024", "4096"])
def test_fp16_cache_retrieves_at_every_depth(context: str) -> None:
    evaluation = json.loads((MODEL / "model_eval.json").read_text())
    entry = evaluation["passkey_fp16"][context]
    assert list(entry["by_depth"]) == [f"{d / 10:.1f}" for d in range(11)]
    assert entry["trials"] >= 20 * 11
    assert min(entry["by_depth"].values()) >= 0.95
