"""Batch caches stay packed and match single-request caches row for row through every batch move.

merge -> right-padded prompt chunk (prepare/finalize) -> decode -> filter -> extend -> extract
-> trim, on random data, for each batchable quantization method, against per-request caches fed
the same tokens. Real arrays, no model (the model-level check is in test_contract.py).
"""

from __future__ import annotations

import copy
import gc
from typing import Any, Protocol, Self

import mlx.core as mx
import pytest

from tests.kv.support import config_for, held_arrays, merged, quantization_methods, settle
from veloxd.kv import registry
from veloxd.kv.base import LayerSpec, VeloxCache
from veloxd.kv.factory import cache_class
from veloxd.kv.quant.kivi import KIVICache
from veloxd.kv.quant.kivi_batch import KIVIBatch
from veloxd.kv.quant.tokenbatch import TokenQuantBatchCache
from veloxd.kv.quant.tokencache import TokenQuantCache

HEADS, DIM, SCALE = 2, 128, 128**-0.5
METHODS = [p for p in quantization_methods() if registry.get(p.values[0]).batchable]


class Batch(Protocol):
    """A batch cache as mlx_lm's BatchGenerator drives it (TokenQuantBatchCache and KIVIBatch each
    declare these, with their own argument types: veloxd.kv.base names no common type for the moves)."""

    @property
    def offset(self) -> mx.array: ...
    @property
    def nbytes(self) -> int: ...
    def size(self) -> int: ...
    def empty(self) -> bool: ...
    def make_mask(self, N: int) -> Any: ...
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> object: ...
    def attend(self, queries: mx.array, scale: float, mask: Any) -> mx.array: ...
    def prepare(
        self,
        *,
        left_padding: list[int] | None = None,
        lengths: list[int] | None = None,
        right_padding: list[int] | None = None,
    ) -> None: ...
    def finalize(self) -> None: ...
    def filter(self, batch_indices: list[int]) -> None: ...
    def extend(self, other: Self) -> None: ...
    def extract(self, idx: int) -> VeloxCache: ...
    def trim(self, n: int) -> int: ...


class Rows:
    """Per-request caches, and a batch cache built from copies of them, fed identical tokens."""

    def __init__(self, method: str, lengths: list[int]) -> None:
        cls = cache_class(method)
        assert issubclass(cls, (TokenQuantCache, KIVICache)), cls
        self.cls: type[TokenQuantCache | KIVICache] = cls
        self.config = config_for(method, 4, **({"affine_rotate": True} if method == "affine" else {}))
        self.singles = [cls(self.config, LayerSpec(0, 1)) for _ in lengths]
        for cache, n in zip(self.singles, lengths):
            for chunk in split(n):
                feed(cache, chunk)
        batch = merged(copy.deepcopy(self.singles))
        assert isinstance(batch, (TokenQuantBatchCache, KIVIBatch)), type(batch)
        self.batch: Batch = batch

    def step(self, lengths: list[int]) -> None:
        """One batched call (right-padded to the longest row) vs each single fed its real tokens."""
        width = max(lengths)
        padding = [width - n for n in lengths]
        k, v, q = tokens(len(lengths), width)
        if max(padding):
            self.batch.prepare(lengths=lengths, right_padding=padding)
        mask = self.batch.make_mask(width)
        self.batch.update_and_fetch(k, v)
        out = self.batch.attend(q, SCALE, mask)
        if max(padding):
            self.batch.finalize()
        for b, (cache, n) in enumerate(zip(self.singles, lengths)):
            expected = feed(cache, (k[b : b + 1, :, :n], v[b : b + 1, :, :n], q[b : b + 1, :, :n]))
            assert float(mx.abs(out[b : b + 1, :, :n] - expected).max()) < 1e-5, b
        offsets = self.batch.offset.tolist()
        assert offsets == [c.offset for c in self.singles]


def tokens(rows: int, n: int) -> tuple[mx.array, mx.array, mx.array]:
    k = mx.random.normal((rows, HEADS, n, DIM))
    v = mx.random.normal((rows, HEADS, n, DIM))
    return k, v, mx.random.normal((rows, 2 * HEADS, n, DIM))


def split(n: int) -> list[tuple[mx.array, mx.array, mx.array]]:
    sizes = [n // 2, n - n // 2] if n > 1 else [n] * n
    return [tokens(1, s) for s in sizes if s]


def feed(cache: VeloxCache, chunk: tuple[mx.array, mx.array, mx.array]) -> mx.array:
    k, v, q = chunk
    cache.update_and_fetch(k, v)
    return cache.attend(q, SCALE, "causal" if q.shape[2] > 1 else None)


def same_contents(a: VeloxCache, b: VeloxCache) -> None:
    sa, sb = a.state, b.state
    assert sa[0] == sb[0]  # meta: config, layer, offset, per-method extras
    assert len(sa) == len(sb)
    for x, y in zip(sa[1:], sb[1:]):
        assert x.shape == y.shape and mx.array_equal(x, y)


@pytest.mark.parametrize("method", METHODS)
def test_batch_moves_match_single_requests(method: str) -> None:
    mx.random.seed(3)
    rows = Rows(method, [70, 0, 150])
    batch = rows.batch  # checked on a local name: narrowing rows.batch would narrow what its extend() accepts
    assert isinstance(batch, VeloxCache) and not hasattr(batch, "bits")
    rows.step([5, 12, 1])  # right-padded prompt chunk: prepare + finalize
    for _ in range(40):  # decode across quantization boundaries
        rows.step([1, 1, 1])
    rows.batch.filter([2, 0])
    rows.singles = [rows.singles[2], rows.singles[0]]
    for _ in range(3):
        rows.step([1, 1])
    late = Rows(method, [33])
    rows.batch.extend(late.batch)
    rows.singles += late.singles
    for _ in range(3):
        rows.step([1, 1, 1])
    for b, single in enumerate(rows.singles):
        extracted = rows.batch.extract(b)
        assert type(extracted) is rows.cls
        same_contents(extracted, single)
    rows.batch.trim(5)
    for b, single in enumerate(rows.singles):
        single.trim(5)
        same_contents(rows.batch.extract(b), single)
    assert rows.batch.nbytes == sum(a.nbytes for a in held_arrays(rows.batch))


@pytest.mark.parametrize("method", METHODS)
def test_filtered_batch_holds_only_what_it_reports(method: str) -> None:
    mx.random.seed(4)
    rows = Rows(method, [300, 20, 280])
    for _ in range(2):
        rows.step([1, 1, 1])
    rows.batch.filter([1])  # the long rows leave: nothing of them may stay pinned
    batch = rows.batch
    rows.singles.clear()
    mx.eval(held_arrays(batch))
    with_batch = settle()
    reported = batch.nbytes
    n_arrays = len(held_arrays(batch))
    del batch, rows
    gc.collect()
    freed = with_batch - settle()
    # the allocator rounds each buffer up to its page size (4 KiB here): allow that much per array
    assert abs(freed - reported) <= 0.02 * reported + 4096 * n_arrays, (freed, reported)


@pytest.mark.parametrize("method", METHODS)
def test_empty_merges_and_extends(method: str) -> None:
    mx.random.seed(5)
    rows = Rows(method, [0, 0])
    assert rows.batch.empty() and rows.batch.size() == 0
    assert rows.batch.nbytes == sum(a.nbytes for a in held_arrays(rows.batch))
    other = Rows(method, [0])
    rows.batch.extend(other.batch)
    rows.singles += other.singles
    rows.step([3, 7, 1])
    rows.step([1, 1, 1])
    assert rows.batch.offset.tolist() == [4, 8, 2]


def test_kivi_batches_refuse_left_padding_they_cannot_place() -> None:
    rows = Rows("kivi", [0, 0])
    with pytest.raises(ValueError, match="right-padded"):
        rows.batch.prepare(left_padding=[2, 0])


def test_token_batches_take_left_padding() -> None:
    mx.random.seed(6)
    rows = Rows("affine", [0, 0])
    rows.batch.prepare(left_padding=[3, 0])
    k, v, q = tokens(2, 6)
    mask = rows.batch.make_mask(6)
    rows.batch.update_and_fetch(k, v)
    out = rows.batch.attend(q, SCALE, mask)
    expected = feed(rows.singles[0], (k[:1, :, 3:], v[:1, :, 3:], q[:1, :, 3:]))
    assert float(mx.abs(out[:1, :, 3:] - expected).max()) < 1e-5
    assert rows.batch.offset.tolist() == [3, 6]
