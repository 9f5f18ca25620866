"""The retrieval model's training data: seeded, benchmark-format pass keys at the asked depth, true recalls."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import numpy as np
import pytest

from benchmarks.data import PASS_KEY_QUESTION, PassKey, TokenizedCorpus
from benchmarks.training.retrieval_data import (
    ANSWER_WEIGHT,
    KEY_SHAPES,
    Mix,
    RetrievalStream,
    first_occurrence,
    shaped_key,
)

Pieces = tuple[PassKey, TokenizedCorpus]  # the `pieces` fixture: the pass-key builder and the corpus


@pytest.fixture(scope="module")
def pieces() -> Pieces:
    from tokenizers import Tokenizer

    from benchmarks.model import ASSET

    tokenizer = Tokenizer.from_file(str(ASSET / "tokenizer.json"))
    texts = [f"def f_{i}(x):\n    return x * {i} + len('{i}')\n" * 40 for i in range(6)]
    docs = [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)]
    return PassKey(tokenizer), TokenizedCorpus([f"doc{i}" for i in range(6)], docs)


def test_same_seed_same_batches_other_seed_other_batches(pieces: Pieces) -> None:
    passkey, corpus = pieces
    a, b, c = (RetrievalStream(corpus, passkey, seed=s) for s in (3, 3, 4))
    tokens_a, weights_a = a.batch(4, 256)
    tokens_b, weights_b = b.batch(4, 256)
    assert tokens_a.shape == (4, 257) and weights_a.shape == (4, 256)
    assert np.array_equal(tokens_a, tokens_b) and np.array_equal(weights_a, weights_b)
    assert not np.array_equal(tokens_a, c.batch(4, 256)[0])


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_pass_key_sits_at_the_asked_depth_and_is_answered(pieces: Pieces, depth: float) -> None:
    passkey, corpus = pieces
    stream = RetrievalStream(corpus, passkey, seed=1)
    for _ in range(5):
        tokens, weights = stream.passkey_sequence(300, depth=depth)
        assert len(tokens) == len(weights) == 300
        question = first_occurrence(tokens, passkey.question)
        assert question is not None
        answer_start = question + len(passkey.question)
        key = re.search(r"(\d{5})\.", passkey.tokenizer.decode(tokens[answer_start : answer_start + 8].tolist()))
        assert key is not None, "the question is followed by the answer in the benchmark's format"
        intro = passkey.intro(key.group(1))
        start = first_occurrence(tokens, intro)
        # data.PassKey.prompt: the intro starts at round(room * depth) of the room before the question.
        assert start == round((question - len(intro)) * depth)
        answer = passkey.answer(key.group(1))
        assert np.array_equal(tokens[answer_start : answer_start + len(answer)], answer)
        assert np.all(weights[answer_start : answer_start + len(answer)] == ANSWER_WEIGHT)
        digits = passkey.encode(f" {key.group(1)}")
        assert np.all(weights[start + 5 : start + 5 + len(digits)] == 0.0)  # first sight of the key: no loss
    assert PASS_KEY_QUESTION in passkey.tokenizer.decode(tokens.tolist())


def sequences(
    pieces: Pieces, kind: str, seed: int, lengths: tuple[int, ...]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One stream's `kind` sequences (recall, copy) at each length: tokens and weights, both that long."""
    passkey, corpus = pieces
    stream = RetrievalStream(corpus, passkey, seed=seed)
    for length in lengths:
        tokens, weights = getattr(stream, f"{kind}_sequence")(length)
        assert len(tokens) == len(weights) == length
        yield tokens, weights


def test_recall_lines_ask_for_the_values_that_were_defined(pieces: Pieces) -> None:
    passkey, _ = pieces
    for tokens, weights in sequences(pieces, "recall", 2, (129, 1025)):
        text = passkey.tokenizer.decode(tokens.tolist())
        defined = dict(re.findall(r"\n(\w+_\d) = (\d{5})\n", text))
        asked = re.findall(r"\nassert (\w+_\d) == (\d{5})\n", text)
        assert len(asked) >= 2 and len(defined) == len(asked)
        assert all(defined[name] == value for name, value in asked)
        assert (weights == ANSWER_WEIGHT).sum() >= 5 * len(asked)


def test_copy_blocks_repeat_after_random_separators_and_only_repeats_weigh(pieces: Pieces) -> None:
    passkey, corpus = pieces
    for tokens, weights in sequences(pieces, "copy", 4, (33, 257)):
        weighed = np.flatnonzero(weights)
        assert len(weighed) > 0
        assert set(np.unique(weights)) <= {0.0, 1.0} and weights[0] == 0.0
        for i in weighed:  # a weighed token is a copy: it and the id before it were seen together
            before = np.flatnonzero(tokens[: i - 1] == tokens[i - 1])
            assert any(tokens[j + 1] == tokens[i] for j in before), i
    offsets: set[int] = set()
    for seed in range(6):  # separators of random length: the repeat's offset varies
        tokens, weights = RetrievalStream(corpus, passkey, seed=seed).copy_sequence(257)
        first = int(np.flatnonzero(weights)[0])
        offsets.add(first - int(np.flatnonzero(tokens[:first] == tokens[first])[0]))
    assert len(offsets) > 1


def shape_of(key: str) -> str:
    """The KEY_SHAPES pattern a key has: each new digit the next letter."""
    letters: dict[str, str] = {}
    return "".join(letters.setdefault(digit, "ABCDE"[len(letters)]) for digit in key)


def test_shaped_keys_are_five_digit_keys_of_every_shape() -> None:
    rng = random.Random(0)
    keys = [shaped_key(rng) for _ in range(2000)]
    assert all(re.fullmatch(r"[1-9]\d{4}", key) for key in keys)
    assert {shape_of(key) for key in keys} == set(KEY_SHAPES)
    assert len(set(keys)) > 1000  # the digits vary, not only the shapes


def test_hard_keys_reach_pass_keys_and_recalls_and_zero_keeps_the_stream(
    pieces: Pieces,
) -> None:
    passkey, corpus = pieces

    def keys_of(stream: RetrievalStream) -> list[str]:
        found = []
        for _ in range(30):
            text = passkey.tokenizer.decode(stream.passkey_sequence(200)[0].tolist())
            found += re.findall(r"pass key is (\d{5})\.", text)[:1]
            text = passkey.tokenizer.decode(stream.recall_sequence(300)[0].tolist())
            found += re.findall(r"== (\d{5})\n", text)
        return found

    uniform = keys_of(RetrievalStream(corpus, passkey, seed=5))
    hard = keys_of(RetrievalStream(corpus, passkey, seed=5, mix=Mix(hard_keys=1.0)))
    assert len(uniform) > 60 and len(hard) > 60
    assert all(shape_of(key) in KEY_SHAPES for key in hard)
    assert sum(shape_of(key) in KEY_SHAPES for key in uniform) < len(uniform) / 2
    # hard_keys 0 draws nothing extra: the default mix and an explicit 0 give the same data
    default = RetrievalStream(corpus, passkey, seed=6).batch(4, 256)
    explicit = RetrievalStream(corpus, passkey, seed=6, mix=Mix(hard_keys=0.0)).batch(4, 256)
    assert all(np.array_equal(a, b) for a, b in zip(default, explicit))
