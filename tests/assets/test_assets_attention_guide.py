"""The retrieval model's attention supervision: mlx_lm's forward pass, the right targets, and it teaches."""

from __future__ import annotations

import argparse
import functools

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama
from tokenizers import Tokenizer

from benchmarks.data import PassKey
from benchmarks.model import ASSET
from benchmarks.training.attention_guide import (
    GUIDED_HEADS,
    GUIDED_QUERIES,
    guide_targets,
    guided_forward,
    guided_heads,
    guided_loss,
    induction_targets,
)
from benchmarks.training.train_tiny import Trainer, model_config

TINY = argparse.Namespace(
    seed=0, lr=3e-3, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=64, rope_theta=1e4
)


def tiny_model() -> llama.Model:
    mx.random.seed(0)
    return llama.Model(llama.ModelArgs.from_dict(model_config(TINY)))


def test_guided_forward_is_mlx_lms_forward_and_its_heads_are_causal_distributions() -> None:
    model = tiny_model()
    inputs = mx.array(np.random.default_rng(0).integers(0, 64, size=(2, 24)), dtype=mx.int32)  # (batch, length)
    logits, log_probs = guided_forward(model, inputs)
    assert mx.allclose(logits, model(inputs), atol=1e-4).item()
    assert len(log_probs) == len(GUIDED_HEADS)
    for log_prob in log_probs:
        probs = np.asarray(mx.exp(log_prob))  # (batch, length, length)
        assert np.allclose(probs.sum(axis=-1), 1.0, atol=1e-5)
        assert np.triu(probs, k=1).max() < 1e-6  # no attention to later positions


def test_induction_targets_point_after_the_latest_earlier_same_bigram() -> None:
    row = np.array([5, 6, 7, 5, 6, 8, 5, 6, 9])
    targets, weights = induction_targets(row)
    found = {int(i): int(targets[i]) for i in np.flatnonzero(weights)}
    assert found == {4: 2, 7: 5}  # (5, 6) at 1 is followed by 7 (position 2); at 4, by 8 (position 5)


def test_longest_match_induction_reads_the_occurrence_with_the_longer_context() -> None:
    # (3, 4) is followed by 9 after "1 2 3 4" and by 8 after "7 3 4"; the query's context is "1 2 3 4".
    row = np.array([1, 2, 3, 4, 9, 7, 3, 4, 8, 1, 2, 3, 4])
    latest, _ = induction_targets(row, "bigram")
    longest, weights = induction_targets(row, "longest")
    assert latest[-1] == 8 and longest[-1] == 4 and weights[-1] == 1.0
    assert longest[7] == 4  # "7 3 4" matches nothing longer than the bigram: its only earlier (3, 4)


def test_longest_match_induction_points_a_pass_key_answer_at_its_full_stop() -> None:
    """The key is shown twice ("<key>." then "<key> is"): after the question, the answer's last digit is followed by "."."""
    tokenizer = Tokenizer.from_file(str(ASSET / "tokenizer.json"))
    passkey = PassKey(tokenizer)
    prompt, answer = passkey.prompt("73373", np.arange(100, 400, dtype=np.int32), 360, 0.5)
    row = np.concatenate([prompt, answer])
    last_digit = len(prompt) + len(answer) - 2  # the answer ends with "."
    full_stop = int(answer[-1])
    latest, _ = induction_targets(row, "bigram")
    longest, _ = induction_targets(row, "longest")
    assert row[longest[last_digit]] == full_stop and row[latest[last_digit]] != full_stop


def test_an_unknown_induction_match_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'nearest'"):
        induction_targets(np.arange(4), "nearest")


@pytest.mark.parametrize("lookback", [1, 2, 3])
def test_guide_targets_of_the_positional_heads(lookback: int) -> None:
    heads = guided_heads(lookback)
    assert [(layer, head) for layer, head, _ in heads] == [(0, n) for n in range(lookback)] + [(1, 0)]
    targets, weights = guide_targets(np.arange(6)[None, :], "bigram", heads)  # (1, 6): no repeated bigram
    kinds = [kind for _, _, kind in heads]
    for back in range(1, lookback + 1):
        index = kinds.index(f"back_{back}")
        assert targets[index, 0, back:].tolist() == list(range(6 - back))
        assert weights[index, 0].tolist() == [0] * back + [1] * (6 - back)
    assert not weights[kinds.index("induction")].any()
    assert guided_heads() == GUIDED_HEADS and len(GUIDED_HEADS) == 3  # stages 1 to 5 were taught lookback 2
    with pytest.raises(ValueError, match="lookback 0"):
        guided_heads(0)


def test_a_trigram_lookback_tells_apart_the_runs_a_bigram_confuses() -> None:
    """After the answer's "3866" of 38666, the taught target and the "." after the key's "666" carry
    the same two tokens back but different third ones: only lookback 3 lets the induction head match."""
    tokenizer = Tokenizer.from_file(str(ASSET / "tokenizer.json"))
    passkey = PassKey(tokenizer)
    prompt, answer = passkey.prompt("38666", np.arange(100, 400, dtype=np.int32), 360, 0.5)
    row = np.concatenate([prompt, answer])
    query = len(prompt) + 3  # the answer's tokens: " 3" "8" "6" "6" "6" "."; this is its second "6"
    target = int(induction_targets(row, "longest")[0][query])
    full_stop = int(answer[-1])
    intro = int(np.flatnonzero(row == int(answer[0]))[0])  # the key's first sight
    wrong = intro + 5  # the "." after the intro's "666"
    assert row[target] == row[query + 1] and row[wrong] == full_stop

    def seen_by_query(lookback: int) -> tuple[int, ...]:  # the query token and what layer 0 brings it
        return tuple(int(row[query - n]) for n in range(lookback))

    def seen_by_key(position: int, lookback: int) -> tuple[int, ...]:  # a key brings the tokens before it
        return tuple(int(row[position - n]) for n in range(1, lookback + 1))

    assert seen_by_key(target, 2) == seen_by_key(wrong, 2) == seen_by_query(2)
    assert seen_by_key(target, 3) == seen_by_query(3) != seen_by_key(wrong, 3)


def test_long_sequences_guide_their_last_queries_with_absolute_key_positions() -> None:
    length = GUIDED_QUERIES + 40
    row = np.arange(length) % 60 + 3  # period 60: every query from 61 on has its bigram 60 back
    targets, weights = guide_targets(row[None, :])
    assert targets.shape == weights.shape == (len(GUIDED_HEADS), 1, GUIDED_QUERIES)
    induction = [kind for _, _, kind in GUIDED_HEADS].index("induction")
    assert targets[induction, 0, -1] == length - 1 - 60 + 1
    offset = length - GUIDED_QUERIES  # the first guided query's position
    assert weights[induction, 0, 61 - offset :].all() and not weights[induction, 0, : 61 - offset].any()
    model = tiny_model()
    _, log_probs = guided_forward(model, mx.array(row[None, :], dtype=mx.int32))
    assert log_probs[0].shape == (1, GUIDED_QUERIES, length)
    probs = np.asarray(mx.exp(log_probs[0]))[0]  # (guided queries, length): query q is position 40 + q
    assert np.triu(probs, k=1 + length - GUIDED_QUERIES).max() < 1e-6 and probs[0, :41].sum() > 0.999


@pytest.mark.parametrize("lookback", [2, 3])
def test_a_guided_trainer_learns_the_attention_patterns(lookback: int) -> None:
    """Repeated random blocks: the guided heads' attention loss falls by far within a few dozen steps."""
    heads = guided_heads(lookback)
    trainer = Trainer(TINY, model_config(TINY), functools.partial(guided_loss, guide_weight=1.0, heads=heads))
    rng = np.random.default_rng(1)
    first = last = 0.0
    for _ in range(60):
        block = rng.integers(3, 64, size=(8, 12))
        tokens = np.concatenate([block, block, block[:, :9]], axis=1)  # (8, 33): inputs and targets of 32
        targets = guide_targets(tokens[:, :-1], "longest", heads)
        trainer.run_step(tokens, np.ones((8, 32), np.float32), 3e-3, *targets)
        first = first or trainer.last_auxiliary
        last = trainer.last_auxiliary
    assert first > 1.0
    assert last < first / 3, (first, last)


def test_the_unguided_trainer_reports_no_auxiliary_term() -> None:
    trainer = Trainer(TINY, model_config(TINY))
    tokens = np.random.default_rng(2).integers(3, 64, size=(2, 17))
    loss = trainer.run_step(tokens, np.ones((2, 16), np.float32), 1e-3)
    assert loss > 0 and trainer.last_auxiliary == 0.0


def test_train_retrieval_refuses_a_bad_guide_induction_or_hard_keys_by_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.training.train_retrieval import parse_args

    assert parse_args(["--induction", "longest", "--guide", "0.5"]).induction == "longest"
    assert parse_args(["--hard-keys", "0.5"]).hard_keys == 0.5
    assert parse_args(["--lookback", "3"]).lookback == 3
    for argv, named in (
        (["--guide", "-1"], "--guide"),
        (["--guide", "nan"], "--guide"),
        (["--induction", "x"], "--induction"),
        (["--hard-keys", "1.5"], "--hard-keys"),
        (["--hard-keys", "nan"], "--hard-keys"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"), [(["--lookback", "0"], "1 to 4"), (["--lookback", "3", "--heads", "2"], "1 to 2")]
)
def test_train_retrieval_refuses_a_lookback_without_a_head_for_each_token_back(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.training.train_retrieval import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert f"--lookback {argv[1]}: expected {expected}" in capsys.readouterr().err
