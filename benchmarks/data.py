"""Offline text for training and evaluating the tiny model, plus synthetic long-range segments.

The corpus is CPython's standard-library sources and the pydoc topic pages (every machine with
Python has them); files are split into train / held-out by a hash of their relative path.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

HELD_OUT_PERCENT = 3
PASS_KEY_INTRO = "The pass key is {key}. Remember it. {key} is the pass key."
PASS_KEY_QUESTION = "What is the pass key? The pass key is"


def stdlib_files() -> list[Path]:
    """Non-test .py files of the standard library, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if "test" in rel.split("/")[0] or rel.startswith(("site-packages", "idlelib/idle_test")):
            continue
        if "/test" in rel or "tests/" in rel:
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_held_out(name: str) -> bool:
    """Deterministic split: about HELD_OUT_PERCENT % of files, chosen by name hash."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELD_OUT_PERCENT


def documents() -> dict[str, list[tuple[str, str]]]:
    """{"train": [(name, text)], "held_out": [(name, text)]} from stdlib sources and pydoc topics."""
    import pydoc_data.topics

    root = Path(sysconfig.get_paths()["stdlib"])
    split: dict[str, list[tuple[str, str]]] = {"train": [], "held_out": []}
    for path in stdlib_files():
        name = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        split["held_out" if is_held_out(name) else "train"].append((name, text))
    for topic, text in sorted(pydoc_data.topics.topics.items()):
        name = f"pydoc_data/{topic}"
        if text.strip():
            split["held_out" if is_held_out(name) else "train"].append((name, text))
    return split


@dataclass
class TokenizedCorpus:
    """Token ids of every document of one split (one array per document)."""

    names: list[str]
    docs: list[np.ndarray]

    @property
    def total(self) -> int:
        return int(sum(len(d) for d in self.docs))


def tokenize(tokenizer: Tokenizer, docs: list[tuple[str, str]]) -> TokenizedCorpus:
    encoded = tokenizer.encode_batch([text for _, text in docs])
    arrays = [np.asarray(e.ids, dtype=np.int32) for e in encoded]
    return TokenizedCorpus([n for n, _ in docs], arrays)


def long_held_out(corpus: TokenizedCorpus, length: int, count: int) -> list[tuple[str, np.ndarray]]:
    """Up to `count` held-out windows of exactly `length` tokens (longest documents first).

    Documents shorter than `length` are concatenated in name order, so every window is real text.
    """
    order = sorted(range(len(corpus.docs)), key=lambda i: (-len(corpus.docs[i]), corpus.names[i]))
    windows = [(corpus.names[i], corpus.docs[i][:length]) for i in order if len(corpus.docs[i]) >= length]
    if len(windows) < count:
        stream = np.concatenate(
            [corpus.docs[i] for i in sorted(range(len(corpus.docs)), key=lambda i: corpus.names[i])]
        )
        for start in range(0, len(stream) - length, length):
            windows.append((f"concat@{start}", stream[start : start + length]))
            if len(windows) >= count:
                break
    return windows[:count]


class PassKey:
    """Pieces of the pass-key task, tokenized once so training and evaluation agree exactly."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.question = self.encode("\n" + PASS_KEY_QUESTION)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int32)

    def intro(self, key: str) -> np.ndarray:
        return self.encode("\n" + PASS_KEY_INTRO.format(key=key) + "\n")

    def answer(self, key: str) -> np.ndarray:
        return self.encode(f" {key}.")

    def prompt(self, key: str, filler: np.ndarray, length: int, depth: float) -> tuple[np.ndarray, np.ndarray]:
        """(prompt ids ending with the question, answer ids) with the key at `depth` (0..1) of `length`."""
        intro = self.intro(key)
        room = length - len(intro) - len(self.question)
        cut = round(room * depth)
        before, after = filler[:cut], filler[cut:room]
        return np.concatenate([before, intro, after, self.question]), self.answer(key)


def stacked(
    sequence: Callable[[int], tuple[np.ndarray, np.ndarray]], batch_size: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """`batch_size` sequences of length + 1 tokens as int32 (batch, length + 1), and their loss
    weights (batch, length) aligned with the targets (each token's weight is its prediction's)."""
    rows, weights = zip(*(sequence(length + 1) for _ in range(batch_size)))
    return np.stack(rows).astype(np.int32), np.stack([w[1:] for w in weights])


def random_key(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


class TextSampler:
    """Contiguous windows of a corpus' text, documents drawn in proportion to their length."""

    def __init__(self, corpus: TokenizedCorpus, rng: random.Random):
        self.corpus, self.rng = corpus, rng
        weights = np.asarray([len(d) for d in corpus.docs], dtype=np.float64)
        self.cumulative = np.cumsum(weights) / weights.sum()

    def window(self, length: int) -> np.ndarray:
        """A contiguous window of real text (concatenating following documents if needed)."""
        index = int(np.searchsorted(self.cumulative, self.rng.random()))
        index = min(index, len(self.corpus.docs) - 1)
        doc = self.corpus.docs[index]
        start = self.rng.randrange(max(1, len(doc) - length))
        out = doc[start : start + length]
        while len(out) < length:
            index = (index + 1) % len(self.corpus.docs)
            out = np.concatenate([out, self.corpus.docs[index][: length - len(out)]])
        return out


class TrainingStream:
    """Sequences mixing natural text with pass-key and span-copy segments (seeded).

    Copy segments repeat a span (random tokens or real text) after a gap of real text, which is
    what makes induction heads (and with them pass-key retrieval) form in a tiny model.
    Returns (tokens, loss_mask): the first copy of a random span is unpredictable, so it is masked.
    """

    def __init__(
        self, corpus: TokenizedCorpus, passkey: PassKey, vocab_size: int, seed: int, synthetic_fraction: float = 0.6
    ):
        self.corpus = corpus
        self.passkey = passkey
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.synthetic_fraction = synthetic_fraction
        self.text = TextSampler(corpus, self.rng).window

    def span(self, length: int) -> tuple[np.ndarray, bool]:
        if self.rng.random() < 0.5:
            # Ids above the special tokens; the BPE merges are as good as random here.
            ids = [self.rng.randrange(6, self.vocab_size) for _ in range(length)]
            return np.asarray(ids, dtype=np.int32), True
        return self.text(length), False

    def sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        if self.rng.random() >= self.synthetic_fraction:
            tokens = self.text(length)
            return tokens, np.ones(length, dtype=np.float32)
        if self.rng.random() < 0.5:
            return self._passkey_sequence(length)
        return self._copy_sequence(length)

    def _passkey_sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        key = random_key(self.rng)
        answer = self.passkey.answer(key)
        filler = self.text(length)
        depth = self.rng.random()
        # The question may sit anywhere after the key, so the gap spans short and long distances.
        total = self.rng.randint(min(length, 96), length)
        prompt, _ = self.passkey.prompt(key, filler, total - len(answer), depth)
        tokens = np.concatenate([prompt, answer, self.text(length)])[:length]
        mask = np.ones(length, dtype=np.float32)
        return tokens, mask

    def _copy_sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        pieces: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        used = 0
        while used < length:
            span_len = self.rng.randint(8, 48)
            span, random_ids = self.span(span_len)
            gap = self.text(self.rng.randint(0, max(1, (length - used) // 2)))
            first_mask = np.zeros(span_len, np.float32) if random_ids else np.ones(span_len, np.float32)
            pieces += [span, gap, span]
            masks += [first_mask, np.ones(len(gap), np.float32), np.ones(span_len, np.float32)]
            used += 2 * span_len + len(gap)
        return np.concatenate(pieces)[:length], np.concatenate(masks)[:length]

    def induction_sequence(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Mostly random spans repeated after short gaps: the fastest signal for induction heads."""
        if self.rng.random() < 0.15:
            return self.text(length), np.ones(length, dtype=np.float32)
        pieces: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        used = 0
        while used < length:
            span_len = self.rng.randint(6, 32)
            span = np.asarray([self.rng.randrange(6, self.vocab_size) for _ in range(span_len)], dtype=np.int32)
            gap = self.text(self.rng.randint(0, 48))
            pieces += [span, gap, span]
            masks += [np.zeros(span_len, np.float32), np.ones(len(gap), np.float32), np.ones(span_len, np.float32)]
            used += 2 * span_len + len(gap)
        return np.concatenate(pieces)[:length], np.concatenate(masks)[:length]

    def batch(self, batch_size: int, length: int, induction: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(batch, length + 1) tokens and (batch, length) loss mask aligned with the targets."""
        return stacked(self.induction_sequence if induction else self.sequence, batch_size, length)
