"""The training-time pass-key probe scores exactly what the benchmark's cache-based decoding scores."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_map
from mlx_lm import load
from tokenizers import Tokenizer

from benchmarks.data import PassKey, documents, tokenize
from benchmarks.kv.passkey import answer_token_hits
from benchmarks.kv.retrieval import MODEL
from benchmarks.model import ASSET
from benchmarks.training.retrieval_probe import PROBE_DEPTHS, Probe, whole_key_accuracy
from veloxd.kv.factory import native_caches


@pytest.mark.parametrize("length", [256])
def test_batched_probe_equals_answer_token_hits_through_caches(length: int) -> None:
    """On the retrieval model and on the base model (which misses), so hits and misses both occur.
    In float32: the two paths' agreement does not depend on the dtype, and MLX's CPU float16 matmuls
    are slow (a float32 one goes through BLAS)."""
    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    probe = Probe(PassKey(tokenizer), tokenize(tokenizer, documents()["held_out"]), length, keys_per_depth=1)
    assert len(probe.spans) == len(PROBE_DEPTHS)
    hits_seen = tokens_seen = 0
    for path in (MODEL, ASSET):
        model = load(str(path))[0]
        model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
        batched = probe.token_hits(model)
        whole_keys = []
        for row, (start, end) in enumerate(probe.spans):
            prompt, answer = probe.tokens[row, :start], probe.tokens[row, start:end]
            through_caches = answer_token_hits(model, native_caches(model), prompt, answer)
            assert batched[row].tolist() == through_caches, (path.name, row)
            whole_keys.append(all(through_caches))
            hits_seen += sum(through_caches)
            tokens_seen += end - start
        assert whole_key_accuracy(batched) == pytest.approx(sum(whole_keys) / len(whole_keys))
    assert 0 < hits_seen < tokens_seen  # a mix, so the match means something
