"""Training sequences for the retrieval model: code text, pass-key prompts and key=value recall.

Four kinds of sequence, seeded so a run is reproducible:
- plain code text (the model stays a code model);
- a random-id block repeated after random-id separators (`--copy`): the densest signal for the
  induction circuit. Measured (2026-12-02, from scratch, 2 cores, docs/results.md):
  on such data only, copy loss fell from 7.6 to 2.8 nats in 400 steps at 32 tokens and to 4.1 at
  48, and stayed at 7.2 after 300 at 192: the plateau before an induction head forms grows with
  the context (quadratically, Musat et al. 2025, arXiv:2511.01033);
- a pass-key prompt in exactly the benchmark's format (data.PassKey), the key at a random depth
  (with extra mass at the ends 0.0 and 1.0, which the benchmark asks for), answered at the end;
- several `name = value` lines embedded in code text, then recall lines `name == value` at the
  end, so retrieval is learned as a general lookup, not only for the pass-key sentence.
Keys and values are uniform 5-digit numbers, or (`--hard-keys`, a fraction) drawn from
KEY_SHAPES: periodic and repeated-digit keys such as 43636 or 38666. Those are the ones a
stage-4 model kept missing (docs/results.md): after "4363" an earlier "36" is followed by "3",
so only the longer context tells the answer's last "6" from its first one.
Loss masks: random digits the model cannot predict (the first sight of a key or value) weigh 0,
answers weigh ANSWER_WEIGHT, so the sparse retrieval signal is not drowned by the code loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from benchmarks.data import PassKey, TextSampler, TokenizedCorpus, random_key, stacked

ANSWER_WEIGHT = 4.0
VOCAB = 2048  # the shared tiny-llama tokenizer's; ids below 6 are special tokens
END_DEPTH_MASS = 0.1  # probability of depth exactly 0.0, and again of exactly 1.0
# Digit patterns of the hard keys, in first-appearance letter order (ABCBC is 43636 or 15656).
KEY_SHAPES = (
    "AAAAA", "AAAAB", "ABBBB", "AABBB", "AAABB", "ABAAA", "AABAA", "ABCCC", "ABBBC", "ABABA",
    "ABABC", "ABCBC", "ABCAB", "ABACA", "ABCAC", "ABCBA", "ABBAB", "AABAB", "ABCDC", "ABCBD",
)  # fmt: skip
NAME_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "omega",
    "token",
    "cache",
    "buffer",
    "index",
    "offset",
    "limit",
    "count",
    "total",
    "prefix",
    "suffix",
    "header",
    "footer",
    "socket",
    "stream",
    "parser",
    "record",
    "worker",
    "queue",
    "batch",
    "layer",
    "block",
    "chunk",
]


@dataclass(frozen=True)
class Mix:
    """Fractions of each kind of sequence (the rest is plain code text)."""

    passkey: float = 0.4
    recall: float = 0.3
    max_recalls: int = 6  # recall pairs per sequence, at most (long sequences carry more signal)
    copy: float = 0.1
    hard_keys: float = 0.0  # fraction of keys and values drawn from KEY_SHAPES

    def to_dict(self) -> dict[str, float]:
        code = round(1 - self.passkey - self.recall - self.copy, 4)
        return {
            "passkey": self.passkey,
            "recall": self.recall,
            "copy": self.copy,
            "code": code,
            "max_recalls": self.max_recalls,
            "hard_keys": self.hard_keys,
        }


def shaped_key(rng: random.Random) -> str:
    """A 5-digit key of a random KEY_SHAPES pattern (never a leading 0, like data.random_key)."""
    shape = rng.choice(KEY_SHAPES)
    letters = sorted(set(shape))
    while True:
        digits = dict(zip(letters, rng.sample("0123456789", len(letters))))
        if digits[shape[0]] != "0":
            return "".join(digits[letter] for letter in shape)


def key_depth(rng: random.Random) -> float:
    roll = rng.random()
    if roll < END_DEPTH_MASS:
        return 0.0
    if roll < 2 * END_DEPTH_MASS:
        return 1.0
    return rng.random()


def first_occurrence(tokens: np.ndarray, pattern: np.ndarray) -> int | None:
    """Index of the first place `pattern` occurs in `tokens`, or None."""
    windows = np.lib.stride_tricks.sliding_window_view(tokens, len(pattern))  # (n - k + 1, k)
    hits = np.flatnonzero((windows == pattern).all(axis=1))
    return int(hits[0]) if len(hits) else None


class RetrievalStream:
    """(tokens, loss weights) sequences of one length from the training split (see module doc)."""

    def __init__(self, corpus: TokenizedCorpus, passkey: PassKey, seed: int, mix: Mix = Mix()):
        self.corpus = corpus
        self.passkey = passkey
        self.mix = mix
        self.rng = random.Random(seed)
        self.text = TextSampler(corpus, self.rng).window  # code text, drawn by document length

    def sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        roll = self.rng.random()
        if roll < self.mix.passkey:
            return self.passkey_sequence(length)
        if roll < self.mix.passkey + self.mix.recall:
            return self.recall_sequence(length)
        if roll < self.mix.passkey + self.mix.recall + self.mix.copy:
            return self.copy_sequence(length)
        return self.text(length), np.ones(length, dtype=np.float32)

    def copy_sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """One random-id block of 4 to length/3 ids, repeated after random-id separators until full.

        The induction (look up, then copy) circuit that retrieval is made of. The separators'
        random lengths leave no fixed offset to copy from, so only matching content predicts a
        repeat. The block's first sight, its first id each time, and the separators weigh 0.
        """
        block = self._random_ids(self.rng.randint(4, max(4, length // 3)))
        pieces: list[np.ndarray] = []
        weights: list[np.ndarray] = []
        used = 0
        while used < length:
            separator = self._random_ids(self.rng.randint(1, max(1, length // 8)))
            repeat = np.zeros(len(block), np.float32) if not pieces else np.ones(len(block), np.float32)
            repeat[0] = 0.0
            pieces += [separator, block]
            weights += [np.zeros(len(separator), np.float32), repeat]
            used += len(separator) + len(block)
        return np.concatenate(pieces)[:length], np.concatenate(weights)[:length]

    def key(self) -> str:
        # No draw at all when hard_keys is 0, so earlier stages' data streams replay unchanged.
        if self.mix.hard_keys and self.rng.random() < self.mix.hard_keys:
            return shaped_key(self.rng)
        return random_key(self.rng)

    def _random_ids(self, count: int) -> np.ndarray:
        return np.asarray([self.rng.randrange(6, VOCAB) for _ in range(count)], dtype=np.int32)

    def passkey_sequence(self, length: int, depth: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A benchmark-format prompt of `length - len(answer)` tokens, then the answer.

        The question ends the sequence (as in the benchmark) half the time; otherwise the prompt
        is shorter and code text follows, so short key-question distances are seen too.
        """
        key = self.key()
        answer = self.passkey.answer(key)
        full = length - len(answer)
        total = full if self.rng.random() < 0.5 else self.rng.randint(min(full, 96), full)
        depth = key_depth(self.rng) if depth is None else depth
        prompt, _ = self.passkey.prompt(key, self.text(total), total, depth)
        tail = self.text(length - total - len(answer))
        tokens = np.concatenate([prompt, answer, tail])
        weights = np.ones(length, dtype=np.float32)
        # The key's first sight is random digits: no loss there (its repeat is a copy and keeps it).
        digits = self.passkey.encode(f" {key}")
        first = first_occurrence(tokens, digits)
        if first is not None:
            weights[first : first + len(digits)] = 0.0
        weights[total : total + len(answer)] = ANSWER_WEIGHT
        return tokens, weights

    def recall_sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """2 to max_recalls (fewer when short) `name = value` lines at random places in code text, recalled in shuffled order at the end."""
        # ~37 tokens per definition + recall pair: at most one pair per 64 tokens, so text remains.
        count = self.rng.randint(2, max(2, min(self.mix.max_recalls, length // 64)))
        names = [f"{self.rng.choice(NAME_WORDS)}_{self.rng.choice(NAME_WORDS)}_{i}" for i in range(count)]
        values = [self.key() for _ in names]
        defs = [self.passkey.encode(f"\n{n} = {v}\n") for n, v in zip(names, values)]
        order = list(range(count))
        self.rng.shuffle(order)
        queries = [
            (self.passkey.encode(f"\nassert {names[i]} =="), self.passkey.encode(f" {values[i]}\n")) for i in order
        ]
        query_len = sum(len(q) + len(a) for q, a in queries)
        room = length - query_len - sum(len(d) for d in defs)
        cuts = sorted(self.rng.randint(0, room) for _ in defs)
        filler = self.text(room)
        pieces, weights = [], []
        previous = 0
        for cut, definition in zip(cuts, defs):
            pieces += [filler[previous:cut], definition]
            # The value's digits are random at first sight: no loss on the definition line.
            weights += [np.ones(cut - previous, np.float32), np.zeros(len(definition), np.float32)]
            previous = cut
        pieces.append(filler[previous:])
        weights.append(np.ones(room - previous, np.float32))
        for question, answer in queries:
            pieces += [question, answer]
            weights += [np.ones(len(question), np.float32), np.full(len(answer), ANSWER_WEIGHT, np.float32)]
        return np.concatenate(pieces), np.concatenate(weights)

    def batch(self, batch_size: int, length: int, copy_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(batch, length + 1) tokens and (batch, length) loss weights aligned with the targets."""
        return stacked(self.copy_sequence if copy_only else self.sequence, batch_size, length)
